"""degnn benchmarks: `make bench` (python -m degnn.bench) and the partition benchmark."""
