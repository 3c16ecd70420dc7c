"""A probe of LAMP's mechanism inside a real training run, started by the launcher in place of
degnn.train (`cluster.entry=tests.lamp_answers_probe`, used by tests/test_lamp.py). Servers and
trainers run degnn's own entry; on a trainer, every batch's completion is watched:

* the rows the trainer feeds its top block for remote roots are compared with the owners'
  answers, decoded by the run's codec, as the transport handed them over (Owners.answers); what was seen goes
  to <run dir>/answers_rank<r>.json;
* with DEGNN_PROBE_ZERO_ANSWERS=1 those rows are zeroed before training on them (a test-only
  switch, no config key), to compare what a run learns without the owners' answers. On
  synthetic-tiny that does not separate the two (the seeds' local neighbours and the lower
  layers' history rows carry the same information); on a graph built so that only the answers
  carry a remote seed's label (test_lamp.two_hop_graph) the zeroed run cannot fit its batches.
"""
from __future__ import annotations

import json
import os
import sys


def watch(run_dir: str, zero: bool) -> None:
    import torch
    import torch.distributed as dist

    from degnn.pipelines.lamp.pipeline import LAMPPipeline
    from degnn.pipelines.lamp.codec import make_codec

    seen = {"batches": 0, "rows": 0, "max_abs_diff": 0.0, "answer_abs_sum": 0.0, "zeroed": zero}
    complete = LAMPPipeline._complete

    def checked(self, b):
        got = {}
        answers = self.owners.answers

        def capture(ticket):  # the owners' answers exactly as the transport handed them over
            got["answers"] = answers(ticket)
            return got["answers"]

        self.owners.answers = capture
        try:
            cg, x, leaves, top_h = complete(self, b)
        finally:
            del self.owners.answers
        # what the top block must be fed: each owner's answer at its roots' rows
        expect = torch.zeros_like(top_h)
        for r, mask in zip(got["answers"].lamp, b.masks):
            expect[mask] = make_codec(self.cfg.pipeline.codec, self.cfg.model.hidden, self.bits).decode(r.rows)
        if b.top_rows is not None:
            expect = expect[b.top_rows]
        fed = leaves[-1].detach()
        seen["batches"] += 1
        seen["rows"] += len(fed)
        seen["answer_abs_sum"] += float(expect.abs().sum())
        if len(fed):
            seen["max_abs_diff"] = max(seen["max_abs_diff"], float((fed - expect).abs().max()))
        with open(os.path.join(run_dir, f"answers_rank{dist.get_rank()}.json"), "w") as f:
            json.dump(seen, f)
        if zero:
            with torch.no_grad():
                leaves[-1].zero_()
        return cg, x, leaves, top_h

    LAMPPipeline._complete = checked


def main(argv) -> int:
    from degnn.entry import main as entry_main, run_dir_from
    from degnn.compat import strip_local_rank

    if os.environ.get("DGL_ROLE") != "server":
        overrides, _ = strip_local_rank(argv)
        watch(run_dir_from(overrides), os.environ.get("DEGNN_PROBE_ZERO_ANSWERS") == "1")
    return entry_main(argv)


if __name__ == "__main__":
    from degnn.startup import pause_collector

    pause_collector()  # as degnn.train does (degnn/startup.py)
    sys.exit(main(sys.argv[1:]))
