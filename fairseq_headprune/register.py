"""Everything the plugin registers with fairseq; ``user_dir/__init__.py`` imports this module."""

from fairseq_headprune.compat import allow_fairseq_checkpoint_globals
from fairseq_headprune.errors import install_error_hook

allow_fairseq_checkpoint_globals()
install_error_hook()

from fairseq_headprune.methods import dsp, gha, importance_task, voita  # noqa: E402,F401  (register)
from fairseq_headprune.model import transformer  # noqa: E402,F401
