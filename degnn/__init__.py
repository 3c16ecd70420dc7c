"""degnn: distributed GNN training on DGL's distributed graph store (DistDGL baseline, LAMP, TMA)."""

__version__ = "0.1.0"
