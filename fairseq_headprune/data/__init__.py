"""Data builders: the embedded gettext demo corpus."""
