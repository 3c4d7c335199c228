#!/bin/bash
make test && echo 1 > /logs/verifier/reward.txt
