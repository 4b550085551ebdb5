#!/bin/sh
# The demo checks itself (exit status): loss falls, eager and replay agree bit for bit.
exec examples/training_loop/training_loop --steps 30
