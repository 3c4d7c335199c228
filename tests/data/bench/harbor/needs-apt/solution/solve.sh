#!/bin/bash
make
