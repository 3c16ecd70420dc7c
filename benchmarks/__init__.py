"""degnn benchmarks: `make bench` (python -m benchmarks) and the partition benchmark."""
