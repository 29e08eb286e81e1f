"""One module per paper: each scorer, gate kind and criterion of a published method, plus the
fairseq task that runs any scorer under ``fairseq-validate``."""
