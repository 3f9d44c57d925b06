"""``python -m bench.lateness``: where is an answer cut off by its deadline late, under hot load?

The ``hot`` section (``bench/hot.py``) found QuoteFlow's own ``elapsed_ms``
some 20 ms past the budget for *neither* and the cache. This starts a lab
(suppliers 50 ms, ``Cache-Control: max-age=1``) and one QuoteFlow with the
hot section's limits (``--inbound-limit 64``; any further flags, e.g.
``--cache-size 1000`` or ``--event-loop asyncio``, are passed on), whose
process is instrumented (``bench/lateness_probe.py``), drives it with wrk as
the hot section does (64 connections, SKUs Zipf over 50) and prints, over
the fan-outs cut off by their deadline:

- ``timer fired``: how late the deadline's timer ran;
- ``came back``: how late the fan-out came back to the service after its
  deadline (the timer, the task group cancelling each supplier task, each
  unwinding, the task group done);
- ``elapsed_ms`` of those answers (the budget less the 5 ms answer reserve
  is 795 ms);
- ``loop turns`` between the two, with ``--event-loop asyncio`` only;
- ``loop lag``: how late a 5 ms sleep wakes, all along the run.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench import hot
from bench.procs import BenchError, free_port, http, start, stop
from bench.wrk import find_wrk, run_wrk

ROOT = Path(__file__).resolve().parent.parent


def quantiles(samples: list[float]) -> str:
    """p50, p90, p99 and the largest, in ms."""
    if not samples:
        return "none"
    ordered = sorted(samples)

    def at(share: float) -> float:
        return 1000 * ordered[min(len(ordered) - 1, int(share * len(ordered)))]

    return (
        f"n {len(ordered):5d}  p50 {at(0.5):7.2f}  p90 {at(0.9):7.2f}  "
        f"p99 {at(0.99):7.2f}  max {1000 * ordered[-1]:7.2f} ms"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run once; print the figures."""
    parser = argparse.ArgumentParser(prog="python -m bench.lateness", description=__doc__)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds of wrk (4)")
    args, flags = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="quoteflow-lateness-") as scratch:
        work = Path(scratch)
        lab_port, port = free_port(), free_port()
        lab_argv = [sys.executable, "-m", "provider_lab", "--port", str(lab_port)]
        lab = start("lab", lab_argv, lab_port, work, cwd=ROOT)
        out = work / "samples.json"
        quoteflow = None
        try:
            quoteflow = start(
                "quoteflow",
                [
                    *(sys.executable, "-m", "bench.lateness_probe", "--port", str(port)),
                    *("--provider-url", lab.url, "--inbound-limit", str(hot.CONNECTIONS)),
                    *("--log-level", "warning", *flags),
                ],
                port,
                work,
                cwd=ROOT,
                env={"LATENESS_OUT": str(out)},
            )
            http("PUT", lab.url + "/latency", {"ms": hot.LATENCY_MS})
            for supplier in hot.SUPPLIERS:
                http("PUT", f"{lab.url}/cache-control/{supplier}", {"value": hot.CACHE_CONTROL})
            run = run_wrk(
                find_wrk(),
                quoteflow.url,
                connections=hot.CONNECTIONS,
                duration_s=args.duration,
                scenario="normal",
                out_dir=work,
                tag="lateness",
                inspect=True,
                zipf_skus=hot.SKUS,
            )
        except BenchError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return 1
        finally:
            if quoteflow is not None:
                stop(quoteflow)
            stop(lab)
        samples = json.loads(out.read_text())
    complete = run.inspected.get("complete", 0) / run.duration_s
    print(
        f"QuoteFlow {' '.join(flags) or '(hot flags only)'}: {run.rps:.0f} responses/s, "
        f"{complete:.1f} answers/s"
    )
    print(f"  timer fired   {quantiles(samples['fired'])}")
    print(f"  came back     {quantiles(samples['came_back'])}")
    print(f"  elapsed_ms    {quantiles(samples['elapsed'])}")
    print(f"  loop lag      {quantiles(samples['lag'])}")
    if samples["turns"]:
        turns = sorted(collections.Counter(samples["turns"]).items())
        print("  loop turns    " + ", ".join(f"{n} turns: {count}" for n, count in turns))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
