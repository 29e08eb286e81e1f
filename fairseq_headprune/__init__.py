"""fairseq-headprune: find which attention heads of a fairseq Transformer matter and remove the rest.

Importing the package registers nothing; ``fairseq_headprune.register`` does (the ``--user-dir``
shim imports it).
"""

__version__ = "0.1.0"
