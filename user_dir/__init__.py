from fairseq_headprune import register  # noqa: F401
