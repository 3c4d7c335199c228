"""Run a policy over a task suite: k samples per task, graded; pass@1, pass@k, bootstrap CIs.

    python -m c2jax.bench run --suite runs/c2bench-mini --policy oracle --k 1 --out runs/oracle

Writes into `out`: results.json (per task: samples, rewards, flags, tokens, wall time; summary:
pass@1 and pass@k with unbiased estimator, 95% bootstrap CIs over tasks, per category and per
split: the training distribution and the held-out evaluation set), a
text table (also printed), results.png (pass@1 per category with CI bars, and wall time per
task), and optionally SWE-bench `predictions.jsonl` (one line per task: the first sample's diff).
Masked (infrastructure-failure) samples are excluded from n; a task left with no sample is
reported as masked and excluded from the rates. Every finished task is appended to
`out/journal.jsonl`: rerunning the same command resumes a killed run (tasks whose samples were all
masked are retried).
"""
from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import logging
import os
import threading
import time
from typing import Any, Sequence

from c2jax.bench.metrics import bootstrap_ci, pass_at_k
from c2jax.bench.policies import Policy
from c2jax.envs.grading import grade
from c2jax.envs.tasks import TaskRecord

log = logging.getLogger(__name__)


def task_digest(task: TaskRecord) -> str:
    """Content hash of a task record: a journal row is reused only for the identical task."""
    return hashlib.sha256(json.dumps(task.to_json(), sort_keys=True).encode()).hexdigest()[:16]


def load_journal(path: str, policy: str, k: int) -> dict[tuple[str, str], dict[str, Any]]:
    """Finished task rows of an earlier (killed) run with the same policy and k; a torn last line is ignored."""
    done: dict[tuple[str, str], dict[str, Any]] = {}
    if not os.path.exists(path):
        return done
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # the line being written when the run was killed
            if row.get("policy") == policy and row.get("k") == k and \
                    not all(x["masked"] for x in row["row"]["samples"]):  # infra failures are retried
                done[(row["instance_id"], row["task_digest"])] = row["row"]
    return done


def run_policy(tasks: Sequence[TaskRecord], policy: Policy, k: int = 1, workers: int = 2, *,
               journal: str | None = None, progress: bool = False) -> list[dict[str, Any]]:
    """Per task: {"instance_id", "category", "codebase", "samples": [...]} with graded samples.

    journal: a JSONL file every finished task is appended to (flushed and fsynced); a rerun with the
    same journal, policy and k reuses the rows of identical tasks and runs only the rest, so a
    killed run resumes where it stopped. progress: a progress bar (tqdm) on stderr.
    """
    done = load_journal(journal, policy.name, k) if journal else {}
    lock = threading.Lock()
    jf = open(journal, "a", encoding="utf-8") if journal else None

    def one(task: TaskRecord) -> dict[str, Any]:
        samples = []
        for i in range(k):
            t0 = time.monotonic()
            att = policy.solve(task, i)
            solve_s = time.monotonic() - t0
            g = grade(task, att.diff)
            samples.append({"sample": i, "resolved": g.resolved, "reward": g.reward, "masked": g.masked,
                            "f2p_fraction": g.f2p_fraction, "p2p_regressions": g.p2p_regressions,
                            "flags": g.flags, "tokens": att.tokens, "solve_s": round(att.wall_s or solve_s, 3),
                            "grade_s": round(g.duration_s, 3), "diff": att.diff})
        return {"instance_id": task.instance_id, "category": task.category, "codebase": task.codebase,
                "split": task.split, "samples": samples}

    digests = [task_digest(t) for t in tasks]
    rows: list[dict[str, Any] | None] = [done.get((t.instance_id, d)) for t, d in zip(tasks, digests)]
    todo = [i for i, r in enumerate(rows) if r is None]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(tasks), initial=len(tasks) - len(todo), desc=f"{policy.name}", unit="task")
    try:
        with cf.ThreadPoolExecutor(max(1, workers)) as ex:
            futs = {ex.submit(one, tasks[i]): i for i in todo}
            for fut in cf.as_completed(futs):
                i = futs[fut]
                try:
                    rows[i] = fut.result()
                except BaseException:
                    for f in futs:  # stop queued tasks; those in flight finish, unjournalled
                        f.cancel()
                    raise
                if jf is not None:
                    with lock:
                        jf.write(json.dumps({"policy": policy.name, "k": k, "instance_id": tasks[i].instance_id,
                                             "task_digest": digests[i], "row": rows[i]}) + "\n")
                        jf.flush()
                        os.fsync(jf.fileno())
                if bar is None:
                    log.info("%s: %d/%d %s resolved=%s", policy.name, sum(r is not None for r in rows), len(rows),
                             tasks[i].instance_id, [x["resolved"] for x in rows[i]["samples"]])
                else:
                    bar.update(1)
                    bar.set_postfix(resolved=sum(bool(r) and any(s["resolved"] for s in r["samples"])
                                                 for r in rows))
    finally:
        if bar is not None:
            bar.close()
        if jf is not None:
            jf.close()
    return [r for r in rows if r is not None]


def summarize(per_task: list[dict[str, Any]], ks: Sequence[int] = (1,), seed: int = 0) -> dict[str, Any]:
    """pass@k (unbiased) with bootstrap CIs, overall and per category; tokens and wall time."""
    def block(rows: list[dict[str, Any]]) -> dict[str, Any]:
        nc = []
        for r in rows:
            live = [s for s in r["samples"] if not s["masked"]]
            if live:
                nc.append((len(live), sum(s["resolved"] for s in live)))
        out: dict[str, Any] = {"tasks": len(rows), "graded_tasks": len(nc), "masked_tasks": len(rows) - len(nc)}
        for k in ks:
            vals = [pass_at_k(n, c, k) for n, c in nc if n >= k]
            if not vals:
                continue
            lo, hi = bootstrap_ci(vals, seed=seed)
            out[f"pass@{k}"] = sum(vals) / len(vals)
            out[f"pass@{k}_ci95"] = [lo, hi]
        samples = [s for r in rows for s in r["samples"]]
        out["tampered_samples"] = sum(any(f.startswith("tamper") for f in s["flags"]) for s in samples)
        out["mean_tokens_per_task"] = (sum(s["tokens"] for s in samples) / len(rows)) if rows else 0.0
        out["mean_wall_s_per_task"] = (sum(s["solve_s"] + s["grade_s"] for s in samples) / len(rows)) if rows else 0.0
        return out

    cats = sorted({r["category"] for r in per_task})
    splits = sorted({r.get("split", "train") for r in per_task})
    return {"overall": block(per_task),
            "by_category": {c: block([r for r in per_task if r["category"] == c]) for c in cats},
            "by_split": {sp: block([r for r in per_task if r.get("split", "train") == sp]) for sp in splits}}


def format_table(summary: dict[str, Any], ks: Sequence[int]) -> str:
    head = ["group", "tasks", "masked"] + [f"pass@{k} [95% CI]" for k in ks] + ["tokens/task", "wall s/task"]
    rows = [head]
    groups = ([("overall", summary["overall"])] + list(summary["by_category"].items())
              + [(f"split:{k}", b) for k, b in summary.get("by_split", {}).items()])
    for name, b in groups:
        row = [name, str(b["tasks"]), str(b["masked_tasks"])]
        for k in ks:
            if f"pass@{k}" in b:
                lo, hi = b[f"pass@{k}_ci95"]
                row.append(f"{b[f'pass@{k}']:.3f} [{lo:.3f}, {hi:.3f}]")
            else:
                row.append("-")
        row += [f"{b['mean_tokens_per_task']:.0f}", f"{b['mean_wall_s_per_task']:.2f}"]
        rows.append(row)
    w = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(x) for c, x in zip(r, w)) for r in rows]
    lines.insert(1, "  ".join("-" * x for x in w))
    return "\n".join(lines)


def plot(summary: dict[str, Any], per_task: list[dict[str, Any]], path: str, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [("overall", summary["overall"])] + list(summary["by_category"].items())
    groups = [(n, b) for n, b in groups if "pass@1" in b]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    xs = range(len(groups))
    vals = [b["pass@1"] for _, b in groups]
    err = [[v - b["pass@1_ci95"][0] for v, (_, b) in zip(vals, groups)],
           [b["pass@1_ci95"][1] - v for v, (_, b) in zip(vals, groups)]]
    ax1.bar(xs, vals, yerr=err, capsize=4, color="tab:blue")
    ax1.set_xticks(list(xs), [n for n, _ in groups], rotation=20, ha="right")
    ax1.set_ylim(0, 1.05)
    ax1.set_ylabel("pass@1 (95% bootstrap CI)")
    ax1.set_title(title)
    walls = sorted(sum(s["solve_s"] + s["grade_s"] for s in r["samples"]) for r in per_task)
    ax2.plot(range(len(walls)), walls, marker=".")
    ax2.set_xlabel("task (sorted)")
    ax2.set_ylabel("wall s (solve + grade)")
    ax2.set_title("wall time per task")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_predictions(per_task: list[dict[str, Any]], path: str, model: str) -> str:
    """SWE-bench predictions.jsonl: instance_id, model_name_or_path, model_patch (first sample).

    Tasks converted from SWE-bench get their official instance id back (the adapter escapes ids
    with characters a task id cannot hold), so the official harness finds them."""
    from c2jax.bench.adapters.swebench import swebench_instance_id

    with open(path, "w") as f:
        for r in per_task:
            diff = r["samples"][0]["diff"] if r["samples"] else ""
            iid = swebench_instance_id(r["instance_id"]) if r.get("category") == "swebench" else r["instance_id"]
            f.write(json.dumps({"instance_id": iid, "model_name_or_path": model, "model_patch": diff}) + "\n")
    return path


def run_suite(tasks: Sequence[TaskRecord], policy: Policy, out_dir: str, *, k: int = 1, ks: Sequence[int] | None = None,
              workers: int = 2, predictions: bool = False, title: str = "", progress: bool = False,
              resume: bool = True) -> dict[str, Any]:
    """Run, grade, summarise and write results.json / results.txt / results.png (+ predictions).

    Finished tasks are journalled in `out_dir/journal.jsonl`; with `resume` a rerun into the same
    directory reuses them (a killed run loses at most the tasks in flight).
    """
    os.makedirs(out_dir, exist_ok=True)
    ks = sorted({x for x in (ks or (1, k)) if 1 <= x <= k})
    journal = os.path.join(out_dir, "journal.jsonl")
    if not resume and os.path.exists(journal):
        os.remove(journal)
    t0 = time.monotonic()
    per_task = run_policy(tasks, policy, k, workers, journal=journal, progress=progress)
    summary = summarize(per_task, ks)
    summary["policy"] = policy.name
    summary["k"] = k
    summary["wall_s"] = round(time.monotonic() - t0, 2)
    table = format_table(summary, ks)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"summary": summary, "tasks": per_task}, f, indent=1)
    with open(os.path.join(out_dir, "results.txt"), "w") as f:
        f.write(table + "\n")
    plot(summary, per_task, os.path.join(out_dir, "results.png"), title or f"{policy.name}")
    if predictions:
        write_predictions(per_task, os.path.join(out_dir, "predictions.jsonl"), policy.name)
    summary["table"] = table
    return summary
