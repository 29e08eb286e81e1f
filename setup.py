from setuptools import find_packages, setup

setup(
    name="fairseq-headprune",
    version="0.1.0",
    description="Score, prune and physically remove attention heads of fairseq Transformer "
                "translation models.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["fairseq_headprune", "fairseq_headprune.*"]),
    python_requires=">=3.8,<3.13",
    install_requires=[
        # PyPI's fairseq 0.12.2 does not install on Python >= 3.11; ve-fairseq 0.12.3 is upstream
        # main with the dataclass fix, prebuilt for CPython 3.11 and 3.12, imported as `fairseq`.
        'fairseq==0.12.2; python_version < "3.11"',
        've-fairseq==0.12.3; python_version >= "3.11"',
        "torch>=1.13",
        "numpy",
        "sacrebleu>=2.0",
        "sentencepiece",
        "tqdm",
        "matplotlib",
        "polib",  # parses .mo and .po gettext catalogs for the embedded corpus
        # CP decomposition for collaborative attention (Cordonnier et al. 2020), on its PyTorch
        # backend, as the authors; pinned: parafac's defaults are part of the method
        "tensorly==0.10.0",
        # CoNLL-U dependency parses for Voita et al.'s syntactic heads (analyze --conllu);
        # pinned: its token fields and error types are what the reader relies on
        "conllu==6.0.0",
    ],
    extras_require={
        # pytest-xdist: the suite runs its files on every core (`pytest -n auto`); pinned with
        # the scheduling option (--dist loadfile) the suite relies on
        "test": ["pytest", "pytest-xdist==3.8.0"],
        # analyze --spacy-model: parse the source side instead of giving CoNLL-U
        "syntax": ["spacy==3.8.18"],
        # scripts/reproduce/*: Moses tokenisation/detokenisation and subword-nmt BPE of the
        # papers' data (fairseq_headprune.data.prepare) instead of cloned tool trees
        "repro": ["sacremoses==0.1.1", "subword-nmt==0.3.8"],
    },
    entry_points={"console_scripts": ["fairseq-headprune = fairseq_headprune.cli:main"]},
)
