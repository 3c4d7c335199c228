"""Training loops (continued pretraining, SFT, RL) and the stage runner used by experiments/run.py."""
