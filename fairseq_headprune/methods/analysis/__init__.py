"""Voita, Talbot, Moiseev, Sennrich & Titov (2019), "Analyzing Multi-Head Self-Attention:
Specialized Heads Do the Heavy Lifting, the Rest Can Be Pruned" (ACL, Sec. 4-5): the roles of
heads. :mod:`.attention` records per-head attention maps from a teacher-forced forward pass;
:mod:`.measures` computes confidence, positional and rare-word shares from them; :mod:`.lrp`
the layer-wise relevance of each head; :mod:`.syntax` the dependency accuracy against CoNLL-U
parses. ``evaluation/roles.py`` runs them over a data subset and writes the results."""
