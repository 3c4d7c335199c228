"""Hugging Face checkpoints: `config.json` <-> `ModelConfig` (`config`), parameter-name mapping
(`keys`), quantised weight formats (`formats`), and `from_pretrained` / `save_pretrained` (`io`)."""
