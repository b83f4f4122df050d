"""``make chaos``: every chaos scenario on one fleet at the tightest timings, reported in
docs/reliability.md (between its ``chaos:begin``/``chaos:end`` marks) and as JSON.

    python -m tests.chaos                                  # all scenarios, report written
    python -m tests.chaos --only load sigstop --no-doc     # some, printed only
    python -m tests.chaos --only failover --no-doc         # the Redis Sentinel failover alone

The failover scenarios (tests/chaos/failover.py) each start a fleet of their own (a master, a
replica, three Sentinels, two gateways, two workers), after the shared fleet has stopped; so does
``fairness`` (tests/chaos/fairness.py: four keys of a keys file, two workers) and ``swap_kill_*``
(tests/chaos/swap.py: a multi-model worker killed in the middle of a swap).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.chaos import bookkeeping, caches, classes, failover, fairness, scenarios, slowloris, swap
from tests.chaos.client import Client
from tests.fleet import Fleet

KEYS = ("chaos-key-a", "chaos-key-b")
TIMINGS = {"INFERQ_HEARTBEAT_S": "0.5", "INFERQ_WORKER_TTL_S": "3", "INFERQ_MAX_NUM_SEQS": "32",
           "INFERQ_API_KEYS": ",".join(KEYS), "INFERQ_MAX_QUEUE_DEPTH": "200"}
ORDER = ["poison", *slowloris.SCENARIOS, "expiry", "load", "sigstop", "redis_down", "faults", "hot_prefix",
         *caches.SCENARIOS, *classes.SCENARIOS, *bookkeeping.SCENARIOS, *failover.SCENARIOS, *fairness.SCENARIOS,
         *swap.SCENARIOS]
OWN_FLEET = {*failover.SCENARIOS, *fairness.SCENARIOS, *swap.SCENARIOS}


def verdict(name: str, r: dict[str, Any]) -> list[str]:
    """What went wrong in a scenario's report (empty: it held)."""
    bad = [f"{k} = {r[k]}" for k in ("lost", "corrupted", "bare_closes") if r.get(k)]
    if r.get("workers_alive", 0) < r.get("workers", 0):
        bad.append("a worker went down")
    if name == "load" and (r["reaped"] or r["failed"]):
        bad.append(f"reaped {r['reaped']}, failed {r['failed']}")
    if name == "sigstop" and not (r["reaped"] and r.get("registered_again")):
        bad.append("the frozen worker was not reaped, or did not come back")
    if name == "expiry" and (r["leaked"] or not r["succeeded"] or r["record_ttl_s"] < r["log_ttl_s"]):
        bad.append(f"leaked {r['leaked']}, record TTL {r['record_ttl_s']} s < log TTL {r['log_ttl_s']} s?")
    if name == "poison":
        msgs = [v for k, v in r["sockets_and_messages"].items() if k.startswith("message")]
        socks = [v for k, v in r["sockets_and_messages"].items() if not k.startswith("message")]
        if r["not_4xx"] or any(v != "failed undecodable_job" for v in msgs) or any("no event" in v for v in socks):
            bad.append("a poison request was not refused with a 4xx, or a message was not failed")
    if name == "hot_prefix" and not r.get("killed"):
        bad.append("no job was seen running on a worker to kill")
    if name in ("load", "sigstop", "redis_down", "poison", "hot_prefix") and \
            r.get("succeeded", 0) + sum(r.get("failed", {}).values()) != r.get("submitted", 0):
        bad.append("not every job ended")
    return bad + _module_problems(name, r)


def _module_problems(name: str, r: dict[str, Any]) -> list[str]:
    """What the scenario's own module checks, for the scenarios a module of their own runs."""
    if name in bookkeeping.SCENARIOS:
        return bookkeeping.problems(name, r)
    if name in slowloris.SCENARIOS:
        return slowloris.problems(name, r)
    for module in (failover, fairness, caches, classes, swap):
        if name in module.SCENARIOS:
            return list(module.problems(r))
    return []


def _cell(name: str, r: dict[str, Any]) -> str:
    """What is particular to the scenario, in a few words."""
    if name in bookkeeping.SCENARIOS:
        return bookkeeping.cell(name, r)
    if name in slowloris.SCENARIOS:
        return slowloris.cell(name, r)
    for module in (failover, fairness, caches, classes, swap):
        if name in module.SCENARIOS:
            return str(module.cell(r))
    if name == "load":
        return f"{r['max_tokens']} tokens each, all at once; reaped {r['reaped']}; wall {r['wall_s']} s"
    if name == "sigstop":
        return (f"frozen {r.get('stopped_s')} s; its jobs taken back: {r['reaped']}; "
                f"registered again: {r.get('registered_again', False)}")
    if name == "redis_down":
        return f"down {r['down_s']:g} s; sockets told why (error event): {r['told']}"
    if name == "expiry":
        return (f"record TTL {r['record_ttl_s']} s ≥ log TTL {r['log_ttl_s']} s; after the record expired: "
                + ", ".join(f"{k} {v}" for k, v in r["after"].items()) + f"; leaked {r['leaked']}")
    if name == "hot_prefix":
        return (f"{r['submitted']} jobs sharing a ~1,000-token prefix; killed {r.get('killed')}, the worker running "
                f"them; ended on: " + ", ".join(f"{w} {n}" for w, n in sorted(r["ended_on"].items())))
    if name == "poison":
        return (f"{len(r['requests'])} requests: not 4xx {r['not_4xx']}; "
                + "; ".join(f"{k}: {v}" for k, v in r["sockets_and_messages"].items()))
    return (f"{r['kills']} kills, {r['redis_restarts']} Redis restart(s); redelivery p50/max "
            f"{r['redelivery_s'].get('p50')}/{r['redelivery_s'].get('max')} s; cancel→abort p50 "
            f"{r['cancel_to_abort_s'].get('p50')} s")


def table(reports: dict[str, dict[str, Any]], host: str) -> str:
    rows = ["| scenario | jobs | succeeded | failed | lost | corrupted | bare closes | restarts | what else | held |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in reports.items():
        bad = r["verdict"]
        rows.append(f"| {name} | {r.get('submitted', 1)} | {r.get('succeeded', '')} | {r.get('failed', {}) or 0} | "
                    f"{r.get('lost', 0)} | {r.get('corrupted', 0)} | {r.get('bare_closes', 0)} | "
                    f"{r.get('restarts', {}) or 0} | {_cell(name, r)} | "
                    f"{'yes' if not bad else 'NO: ' + '; '.join(bad)} |")
    return f"Run of {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {host}.\n\n" + "\n".join(rows) + "\n"


def write_doc(doc: Path, text: str) -> None:
    src = doc.read_text()
    new = re.sub(r"(<!-- chaos:begin -->\n).*?(<!-- chaos:end -->)", lambda m: m[1] + text + m[2], src, flags=re.S)
    if new == src and text not in src:
        raise SystemExit(f"{doc} has no <!-- chaos:begin --> / <!-- chaos:end --> marks")
    doc.write_text(new)


async def settle(fleet: Fleet, workers: int = 2) -> None:
    """Back to ``workers`` live, registered workers before the next scenario."""
    for wid in list(fleet.workers):
        if not fleet.workers[wid].alive():
            fleet.workers.pop(wid)
    while len(fleet.workers) < workers:
        fleet.start_worker(wait=False)
    for wid in list(fleet.workers):
        await asyncio.to_thread(fleet.wait_worker, wid, 240)


async def run(fleet: Fleet, only: list[str], sizes: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    a, b = (Client(fleet.base, fleet.ws, k) for k in KEYS)
    reports = {}
    try:
        for name in only:
            await settle(fleet)
            t0 = time.time()
            module = next((m for m in (bookkeeping, slowloris, caches, classes) if name in m.SCENARIOS), scenarios)
            fn = getattr(module, name)
            r = await (fn(fleet, a, b) if name == "expiry" else fn(fleet, a, **sizes.get(name, {})))
            r["scenario_s"] = round(time.time() - t0, 1)
            r["verdict"] = verdict(name, r)
            reports[name] = r
            print(name, json.dumps(r), flush=True)
    finally:
        await a.aclose()
        await b.aclose()
    return reports


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=ORDER, default=ORDER)
    p.add_argument("--out", type=Path, default=Path("docs/results/chaos.json"))
    p.add_argument("--doc", type=Path, default=Path("docs/reliability.md"))
    p.add_argument("--no-doc", action="store_true", help="print the report; write no file")
    p.add_argument("--sizes", type=json.loads, default={},
                   help='per-scenario arguments, e.g. \'{"load": {"jobs": 16}, "faults": {"jobs": 60}}\'')
    a = p.parse_args()
    fleet = Fleet(Path(tempfile.mkdtemp(prefix="inferq-chaos-")), extra_env=TIMINGS, api_key=KEYS[0])
    t0 = time.time()
    shared = [n for n in ORDER if n in a.only and n not in OWN_FLEET]
    reports: dict[str, dict[str, Any]] = {}
    if shared:
        try:
            fleet.start()
            reports = asyncio.run(run(fleet, shared, a.sizes))
        finally:
            fleet.stop()
    for name in (n for n in ORDER if n in a.only and n in OWN_FLEET):  # a fleet of their own
        t1 = time.time()
        if name in fairness.SCENARIOS:
            r = fairness.run(fleet.logdir, TIMINGS, a.sizes.get(name, {}))
        elif name in swap.SCENARIOS:
            r = swap.run(name, fleet.logdir, TIMINGS, KEYS[0], a.sizes.get(name, {}))
        else:
            r = failover.run(name, fleet.logdir, TIMINGS, KEYS, a.sizes.get(name, {}))
        r.update(scenario_s=round(time.time() - t1, 1), verdict=verdict(name, r))
        reports[name] = r
        print(name, json.dumps(r), flush=True)
    host = f"{platform.node()} ({__import__('os').cpu_count()} CPUs), tiny model, CPU vLLM, " \
           f"heartbeat 0.5 s, worker TTL 3 s, 32 sequences per engine, 2 workers; {round(time.time() - t0)} s in all"
    text = table(reports, host)
    print(text)
    if not a.no_doc:
        a.out.write_text(json.dumps({"host": host, "logs": str(fleet.logdir), "scenarios": reports}, indent=2) + "\n")
        write_doc(a.doc, text)
    if any(r["verdict"] for r in reports.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
