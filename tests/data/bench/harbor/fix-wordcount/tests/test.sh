#!/bin/bash
# Harbor verifier: run the checks, write the reward for the harness.
mkdir -p /logs/verifier
cd /app
if python -m pytest -q -p no:cacheprovider /tests/test_outputs.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
