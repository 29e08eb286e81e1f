"""Everything the plugin registers with fairseq; ``user_dir/__init__.py`` imports this module."""

from fairseq_headprune.compat import allow_fairseq_checkpoint_globals

allow_fairseq_checkpoint_globals()

from fairseq_headprune.methods import (
    importance_task,  # noqa: E402,F401  (register with fairseq)
)
from fairseq_headprune.model import transformer  # noqa: E402,F401
