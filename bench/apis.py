"""The supplier-APIs section of ``make bench`` (issue 29): what a shaped request costs.

One lab, three QuoteFlow processes against it, all at saturate (connections =
the inbound limit), in blocks of A B C C B A so that a noisy neighbour hurts
each alike:

- ``shaped``: atlas, boreal and cedar asked in the lab's ``json`` dialect — a
  templated ``POST`` with a JSON body, an OAuth2 client-credentials token (an
  hour's lifetime: fetched once), and the ``provider_lab.adapters:json_dialect``
  adapter picking the price break for the quantity;
- ``shaped_get``: the same three in the lab's ``path`` dialect — a templated
  ``GET`` with the SKU in the path and an API key from ``${VAR}`` in the
  query, read by ``provider_lab.adapters:path_dialect``: the templates' and
  the adapter's cost without a request body (which aiohttp writes from a task
  of its own);
- ``classic``: the same three asked the classic way, by a catalogue file that
  uses none of it;
- ``before``: QuoteFlow as it was before issue 29 (``BENCH_BEFORE_REF``, by
  default the merge base with ``main``), with the same classic catalogue.

The headline figures are CPU milliseconds per answer of QuoteFlow's own
process, as ratios within a block and then their median: ``shaped ÷ classic``
(target ≤ 1.05) and ``classic ÷ before`` (a catalogue using none of it costs
nothing: target ≤ 1.01). Throughput ratios are reported too; at saturate they
are the lab's and the client's as much as QuoteFlow's.

Standalone: ``python -m bench.apis [--rounds 4] [--duration 4] [--latency-ms 0]``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from bench.catalogue import before_tree, measured_run, settle
from bench.procs import BenchError, Service, free_port, http, start, stop
from bench.report import Target, median_text, target_line
from bench.stats import ratio, spread
from bench.wrk import find_wrk, run_wrk

if TYPE_CHECKING:
    from bench.core import Bench

NAME = "supplier_apis"
THREE = ("atlas", "boreal", "cedar")
CONTENDERS = ("shaped", "shaped_get", "classic", "before")
PAIRS = (("shaped", "classic"), ("shaped_get", "classic"), ("classic", "before"))
TARGETS: dict[str, float | None] = {
    "shaped/classic": 1.05,
    "shaped_get/classic": None,  # reported: where the cost of shaped comes from
    "classic/before": 1.01,
}
MIN_ROUNDS = 4
ROOT = Path(__file__).resolve().parent.parent


def catalogues(lab_url: str, into: Path) -> tuple[Path, Path, Path]:
    """The classic catalogue, the shaped one and the shaped GET one, for the same three."""
    classic = into / "classic.toml"
    classic.write_text(
        "".join(
            f'[[supplier]]\nname = "{name}"\nurl = "{lab_url}/quotes/{name}"\n\n' for name in THREE
        )
    )
    shaped = into / "shaped.toml"
    shaped.write_text(
        "".join(
            f"""[[supplier]]
name = "{name}"
method = "POST"
url = "{lab_url}/json/{name}/quote"
adapter = "provider_lab.adapters:json_dialect"

[supplier.body]
items = [ {{ partNumber = "{{sku}}", quantity = "{{quantity}}" }} ]
scenario = "{{scenario}}"

[supplier.oauth2]
token_url = "{lab_url}/oauth2/token"
client_id = "quoteflow"
client_secret = "${{LAB_CLIENT_SECRET}}"

"""
            for name in THREE
        )
    )
    shaped_get = into / "shaped_get.toml"
    shaped_get.write_text(
        "".join(
            f"""[[supplier]]
name = "{name}"
url = "{lab_url}/path/{name}/parts/{{sku}}/price"
query = {{ qty = "{{quantity}}", key = "${{LAB_API_KEY}}", scenario = "{{scenario}}" }}
adapter = "provider_lab.adapters:path_dialect"

"""
            for name in THREE
        )
    )
    return classic, shaped, shaped_get


def _quoteflow(
    name: str,
    catalogue: Path,
    *,
    budget_s: float,
    inbound: int,
    outbound: int,
    log_dir: Path,
    extra: Sequence[str] = (),
    cwd: Path = ROOT,
) -> Service:
    port = free_port()
    return start(
        name,
        [
            *(sys.executable, "-m", "quoteflow", "--host", "127.0.0.1", "--port", str(port)),
            *("--budget", str(budget_s), "--inbound-limit", str(inbound)),
            *("--outbound-limit", str(outbound), "--suppliers", str(catalogue)),
            *extra,
        ],
        port,
        log_dir,
        cwd=cwd,
        env={"LAB_CLIENT_SECRET": "lab-secret", "LAB_API_KEY": "lab-key"},
    )


def run_order(rounds: int) -> list[str]:
    """Blocks of A B C C B A."""
    return [name for _ in range(rounds) for name in (*CONTENDERS, *reversed(CONTENDERS))]


def measure(
    *,
    wrk: str,
    rounds: int,
    duration_s: float,
    warmup_s: float,
    budget_s: float,
    inbound: int,
    outbound: int,
    log_dir: Path,
    raw_dir: Path,
    latency_ms: int = 0,
    quoteflow_args: Sequence[str] = (),
) -> dict[str, Any]:
    """Start the lab and the contenders, run every block, stop them all."""
    services: dict[str, Service] = {}
    scratch = Path(tempfile.mkdtemp(prefix="bench-apis-"))
    try:
        lab_port = free_port()
        services["lab"] = lab = start(
            "lab-apis",
            [sys.executable, "-m", "provider_lab", "--port", str(lab_port)],
            lab_port,
            log_dir,
            cwd=ROOT,
        )
        if latency_ms:
            http("PUT", lab.url + "/latency", {"ms": latency_ms})
        classic, shaped, shaped_get = catalogues(lab.url, scratch)
        common = {
            "budget_s": budget_s,
            "inbound": inbound,
            "outbound": outbound,
            "log_dir": log_dir,
            "extra": quoteflow_args,
        }
        services["shaped"] = _quoteflow("shaped", shaped, **common)  # type: ignore[arg-type]
        services["shaped_get"] = _quoteflow("shaped_get", shaped_get, **common)  # type: ignore[arg-type]
        services["classic"] = _quoteflow("classic", classic, **common)  # type: ignore[arg-type]
        before = before_tree(scratch / "before")
        if before is None:
            raise BenchError("supplier_apis: no commit to compare with (set BENCH_BEFORE_REF)")
        services["before"] = _quoteflow(
            "before",
            classic,
            cwd=before,
            **common,  # type: ignore[arg-type]
        )
        checks = {}
        for name in CONTENDERS:
            _, _, answer = http("POST", services[name].url + "/api/quotes", {"quantity": 1})
            checks[name] = answer
            run_wrk(
                wrk,
                services[name].url,
                connections=inbound,
                duration_s=warmup_s,
                scenario="normal",
                out_dir=raw_dir,
                tag=f"warmup-apis-{name}",
            )
        runs = []
        for index, name in enumerate(run_order(rounds)):
            settle(lab)
            service = services[name]
            runs.append(
                measured_run(
                    wrk,
                    service,
                    contender=name,
                    index=index,
                    connections=inbound,
                    duration_s=duration_s,
                    out_dir=raw_dir,
                    section=NAME,
                )
            )
        _, _, oauth2 = http("GET", lab.url + "/oauth2")
    finally:
        for service in services.values():
            stop(service)
        shutil.rmtree(scratch, ignore_errors=True)
    shaped_answer = checks["shaped"]
    complete = isinstance(shaped_answer, dict) and len(shaped_answer.get("quotes", [])) == 3
    return {
        "runs": runs,
        "latency_ms": latency_ms,
        "shaped_quotes_all_three": complete,
        "shaped_answer": shaped_answer,
        "token_fetches": oauth2.get("fetches") if isinstance(oauth2, dict) else None,
    }


def run_apis(bench: Bench) -> dict[str, Any]:
    """The section as ``make bench`` runs it."""
    limits = bench.limits
    return measure(
        wrk=bench.wrk,
        rounds=max(MIN_ROUNDS, bench.options.rounds),
        duration_s=bench.options.duration_s,
        warmup_s=bench.options.warmup_s,
        budget_s=limits.budget_s,
        inbound=limits.inbound,
        outbound=limits.outbound,
        log_dir=bench.log_dir,
        raw_dir=bench.raw_dir,
        quoteflow_args=bench.options.quoteflow_args,
    )


def summarize(section: dict[str, Any]) -> dict[str, Any]:
    """Medians per contender, and each pair's ratios within a half-block, then their median."""
    runs = section["runs"]
    medians = {
        name: {
            "rate_200": spread(r["rate_200"] for r in runs if r["contender"] == name),
            "cpu_ms_per_200": spread(r["cpu_ms_per_200"] for r in runs if r["contender"] == name),
        }
        for name in CONTENDERS
    }
    size = len(CONTENDERS)
    halves = [runs[i : i + size] for i in range(0, len(runs), size)]
    pairs: dict[str, Any] = {}
    for top, bottom in PAIRS:
        throughput, cpu = [], []
        for half in halves:
            found = {r["contender"]: r for r in half}
            if top in found and bottom in found:
                throughput.append(ratio(found[top]["rate_200"], found[bottom]["rate_200"]))
                cpu.append(ratio(found[top]["cpu_ms_per_200"], found[bottom]["cpu_ms_per_200"]))
        pairs[f"{top}/{bottom}"] = {"throughput": spread(throughput), "cpu": spread(cpu)}
    return {
        "medians": medians,
        "ratios": pairs,
        "latency_ms": section["latency_ms"],
        "shaped_quotes_all_three": section["shaped_quotes_all_three"],
        "token_fetches": section["token_fetches"],
    }


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """CPU per answer: shaped within 5 % of classic, classic within 1 % of before."""
    per = summary["medians"]
    rows = []
    for pair, limit in TARGETS.items():
        top, bottom = pair.split("/")
        found = summary["ratios"][pair]["cpu"]
        rows.append(
            Target(
                NAME,
                f"CPU per 200 (ms): {top} | {bottom}",
                _ms(per[top]["cpu_ms_per_200"]),
                _ms(per[bottom]["cpu_ms_per_200"]),
                median_text(found),
                "reported" if limit is None else f"≤ {limit} × {bottom} (issue 29)",
                None if found is None or limit is None else found["median"] <= limit,
            )
        )
    complete = bool(summary["shaped_quotes_all_three"])
    rows.append(Target(NAME, "shaped: all three quoted", str(complete), "", "", "True", complete))
    return [attrs.asdict(row) for row in rows]


def _ms(found: dict[str, float] | None) -> str:
    return "–" if found is None else f"{found['median']:.3f}"


def table(summary: dict[str, Any]) -> str:
    """The section's lines for the report."""
    lines = [
        "",
        f"supplier APIs (saturate, lab at {summary['latency_ms']} ms)"
        "   throughput ratio   CPU per 200 ratio",
    ]
    for pair, found in summary["ratios"].items():
        tp, cpu = (median_text(found[key]) for key in ("throughput", "cpu"))
        lines.append(f"  {pair:<22} {tp:>10}   {cpu:>12}")
    lines.append(f"  token fetches at the lab: {summary['token_fetches']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.apis", description=__doc__)
    parser.add_argument("--rounds", type=int, default=MIN_ROUNDS)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--latency-ms", type=int, default=0)
    parser.add_argument("--budget", type=float, default=0.8)
    parser.add_argument("--inbound-limit", type=int, default=8)
    parser.add_argument("--outbound-limit", type=int, default=6)
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-apis-out-"))
    try:
        section = measure(
            wrk=find_wrk(),
            rounds=args.rounds,
            duration_s=args.duration,
            warmup_s=1.0,
            budget_s=args.budget,
            inbound=args.inbound_limit,
            outbound=args.outbound_limit,
            log_dir=scratch,
            raw_dir=scratch,
            latency_ms=args.latency_ms,
        )
    except BenchError as exc:
        print(f"bench.apis: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    summary = summarize(section)
    print(table(summary))
    for target in targets(summary):
        print(target_line(target))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
