"""Quickstart: build a small code corpus + tokenizer and continue-pretrain a small MoE on CPU.

    python experiments/run.py --config experiments/configs/quickstart.py --workdir runs/quickstart
    python experiments/run.py --config experiments/configs/quickstart.py:three_phase --workdir runs/qs3
    python experiments/run.py --config experiments/configs/quickstart.py:small --workdir runs/qs_small

Presets (the part after ':'):
    tiny (default)  `tiny` model shape with the 4096-token tokenizer, one `cpt` stage; data build +
                    training well under 10 minutes on 2 CPU cores. Judged by its held-out code loss
                    against a bigram model fitted on the same training split (summary.json:
                    `cpt.held_out_loss_final` vs `cpt.bigram_held_out_loss`, `held_out_minus_bigram`).
    small           the `small` model preset (~15M parameters), same data, fewer steps.
    three_phase     cpt -> long_context (4x longer sequences, YaRN factor 4, fewer steps) -> sft
                    (synthesised chat examples, loss on assistant tokens only).
    smoke           a few steps of each of the three phases (tests and CI).

Outputs in the workdir: summary.json (per stage: steps, tokens, held_out_loss_initial/final,
train_loss_final, tokens_per_s, wall_time_s, bigram baseline), loss_curve.png, and per stage
train.jsonl / eval.jsonl / tb/ / checkpoints/. Rerunning the same command resumes (or finds the
finished stages and only rewrites the summary).
"""
import ml_collections

from c2jax.data import presets as data_presets
from c2jax.model.config import model_config_dict

VOCAB = 4096


def _train(steps: int, batch_size: int, seq_len: int, peak_lr: float, mtp: bool) -> dict:
    loss = {"xent": 1.0, "z_loss": 1e-4}
    if mtp:
        loss["mtp_distill"] = 0.3
    return dict(
        init_from="scratch",
        steps=steps,
        batch_size=batch_size,
        seq_len=seq_len,
        accum_steps=1,
        loss=loss,
        mtp_start_step=steps // 2,  # MTP heads learn by self-distillation from a mid-run point
        optimizer={"name": "adamw", "b1": 0.9, "b2": 0.95, "eps": 1e-8, "weight_decay": 0.05, "clip_norm": 1.0},
        schedule={"name": "wsd", "peak_lr": peak_lr, "warmup_steps": max(steps // 20, 1), "decay_frac": 0.25,
                  "min_lr_ratio": 0.05},
        bias_update_rate=1e-3,
        log_every=10,
        eval_every=max(steps // 4, 1),
        ckpt_every=max(steps // 4, 1),
        keep_checkpoints=2,
        eval={"batch_size": 8, "max_batches": 6, "primary": None, "probe_packages": 3, "probe_max_tokens": 2048,
              "bigram_baseline": True},
    )


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
    arg = arg or "tiny"
    if arg not in ("tiny", "small", "three_phase", "smoke"):
        raise ValueError(f"quickstart preset must be tiny, small, three_phase or smoke, got {arg!r}")
    config = ml_collections.ConfigDict()
    config.seed = 0
    config.stages = ["cpt"]
    config.data = data_presets.quickstart(vocab_size=VOCAB)
    model = "small" if arg == "small" else "tiny"
    # MTP (depth 1, self-distilled from mid-run) in the three-phase and smoke presets; the one-stage
    # quickstart spends its CPU minutes on the main model only.
    mtp = arg in ("three_phase", "smoke")
    # Fixed-capacity MoE: 4-5x faster than ragged_dot for training on CPU (feasibility 3e/4c).
    config.model = model_config_dict(model, vocab_size=VOCAB, max_position_embeddings=1024,
                                     mtp_depth=1 if mtp else 0, **{"moe.impl": "capacity"})
    if arg == "small":
        config.train = _train(steps=300, batch_size=8, seq_len=256, peak_lr=3e-3, mtp=False)
    elif arg == "smoke":
        config.train = _train(steps=6, batch_size=4, seq_len=64, peak_lr=3e-3, mtp=True)
        config.train.eval = {"batch_size": 4, "max_batches": 2, "primary": None, "probe_packages": 1,
                             "probe_max_tokens": 256, "bigram_baseline": True}
        config.train.log_every = 1
    else:  # tiny; three_phase trains its cpt stage half as long
        config.train = _train(steps=300 if mtp else 600, batch_size=8, seq_len=256, peak_lr=1e-2, mtp=mtp)
    if arg in ("three_phase", "smoke"):
        config.stages = ["cpt", "long_context", "sft"]
        base = config.train
        lc_steps = max(base.steps // 5, 2)
        sft_steps = max(base.steps // 5, 2)
        # Long context: 4x the sequence length at a quarter of the rows (same tokens per step), the
        # YaRN factor raised to 4 (positions 1024 -> 4096), short re-warmed cosine.
        config.long_context = dict(
            steps=lc_steps, seq_len=base.seq_len * 4, batch_size=max(base.batch_size // 4, 1), yarn_factor=4.0,
            schedule={"name": "cosine", "peak_lr": base.schedule.peak_lr / 2, "warmup_steps": max(lc_steps // 10, 1),
                      "min_lr_ratio": 0.1, "init_lr_ratio": 0.0},
            eval={"batch_size": max(base.eval.batch_size // 4, 1)},
        )
        # SFT: chat-formatted synthesised examples (whole conversations, so the long rows of the
        # long-context phase), loss on assistant tokens only (the shards' mask).
        config.sft = dict(
            steps=sft_steps, yarn_factor=4.0, mix=data_presets.sft_weights(),
            seq_len=base.seq_len * 4, batch_size=max(base.batch_size // 4, 1),
            eval={"batch_size": max(base.eval.batch_size // 4, 1)},
            schedule={"name": "cosine", "peak_lr": base.schedule.peak_lr / 4, "warmup_steps": max(sft_steps // 10, 1),
                      "min_lr_ratio": 0.1, "init_lr_ratio": 0.0},
        )
    return config
