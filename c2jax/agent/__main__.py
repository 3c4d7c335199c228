"""`python -m c2jax.agent --repo DIR "prompt" --policy ...`: run the agent on a real directory inside a
sandbox (copy-on-write overlay: DIR is not touched), print the transcript and the resulting diff, and
apply the diff to DIR only with --apply.

Policies:
  --policy engine --checkpoint PATH      a c2jax serving checkpoint through the sampling engine
  --policy openai --base-url URL [--model NAME] [--api-key KEY]   any OpenAI-compatible endpoint
  --policy oracle --patch FILE           apply a patch through the apply_patch tool
  --policy scripted --script FILE        a JSON list of assistant messages (OpenAI shape)
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys


def _tokenizer(args):
    from c2jax.data.tokenizer import Tokenizer

    if args.tokenizer:
        return Tokenizer.load(args.tokenizer)
    if args.checkpoint:
        import os

        return Tokenizer.load(os.path.join(args.checkpoint, "tokenizer.json"))
    raise SystemExit("error: this policy renders tokens: pass --tokenizer PATH (or --checkpoint)")


def build_policy(args, fmt_holder: list):
    from c2jax.agent.policies import EnginePolicy, OpenAIPolicy, OraclePolicy, ScriptedPolicy
    from c2jax.data.chat_format import ChatFormat

    if args.policy == "engine":
        if not args.checkpoint:
            raise SystemExit("error: --policy engine needs --checkpoint PATH")
        from c2jax.sampling import Engine, EngineConfig
        from c2jax.sampling.checkpoint import load_serving_checkpoint

        params, cfg, tok = load_serving_checkpoint(args.checkpoint, args.tokenizer)
        fmt = ChatFormat(tok)
        fmt_holder.append(fmt)
        engine = Engine(params, cfg, EngineConfig(max_slots=1, max_len=args.max_len), tokenizer=tok)
        return EnginePolicy(engine, fmt, temperature=args.temperature, seed=args.seed)
    fmt = ChatFormat(_tokenizer(args))
    fmt_holder.append(fmt)
    if args.policy == "openai":
        if not args.base_url:
            raise SystemExit("error: --policy openai needs --base-url URL")
        return OpenAIPolicy(base_url=args.base_url, model=args.model, api_key=args.api_key,
                            temperature=args.temperature, seed=args.seed)
    if args.policy == "oracle":
        if not args.patch:
            raise SystemExit("error: --policy oracle needs --patch FILE")
        with open(args.patch) as f:
            return OraclePolicy(fmt, f.read())
    if args.policy == "scripted":
        if not args.script:
            raise SystemExit("error: --policy scripted needs --script FILE")
        with open(args.script) as f:
            return ScriptedPolicy(fmt, json.load(f))
    raise SystemExit(f"error: unknown policy {args.policy!r}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m c2jax.agent", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prompt")
    ap.add_argument("--repo", required=True, help="the directory the agent works on (a sandboxed copy)")
    ap.add_argument("--policy", required=True, choices=["engine", "openai", "oracle", "scripted"])
    ap.add_argument("--checkpoint")
    ap.add_argument("--tokenizer")
    ap.add_argument("--base-url")
    ap.add_argument("--model")
    ap.add_argument("--api-key")
    ap.add_argument("--patch")
    ap.add_argument("--script")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--max-len", type=int, default=8192, help="engine: tokens per context")
    ap.add_argument("--max-turns", type=int, default=50)
    ap.add_argument("--max-new-tokens", type=int, default=2048)
    ap.add_argument("--summary-trigger", type=int, help="self-summarise when a context reaches this many tokens")
    ap.add_argument("--bash-only", action="store_true", help="only the terminal tool (ablation baseline)")
    ap.add_argument("--out", help="write the trajectory (JSON) here")
    ap.add_argument("--apply", action="store_true", help="apply the resulting diff to --repo")
    ap.add_argument("--quiet", action="store_true", help="do not print the transcript")
    args = ap.parse_args(argv)

    from c2jax.agent.harness import Harness, HarnessConfig
    from c2jax.agent.tools import ToolConfig
    from c2jax.envs import SandboxError, build_env, start

    holder: list = []
    policy = build_policy(args, holder)
    fmt = holder[0]
    max_ctx = args.max_len if args.policy == "engine" else None
    cfg = HarnessConfig(tools=ToolConfig(bash_only=args.bash_only), max_turns=args.max_turns,
                        max_new_tokens=args.max_new_tokens, summary_trigger_tokens=args.summary_trigger,
                        max_context_tokens=max_ctx)
    try:
        env = build_env(args.repo)
        with start(env) as sb:
            ep = Harness(fmt, cfg).run(policy, sb, args.prompt, task_id="cli")
    except SandboxError as e:
        print(f"error: sandbox: {e}", file=sys.stderr)
        return 3
    if not args.quiet:
        for ctx in ep.messages:
            for m in ctx:
                calls = "".join(f"\n  -> {c['function']['name']}({c['function']['arguments'][:200]})"
                                for c in m.get("tool_calls", []))
                print(f"[{m['role']}] {m['content'][:2000]}{calls}", file=sys.stderr)
    e = ep.trajectory.effort
    print(f"stop: {ep.stop_reason}; turns {e.turns}, tool calls {e.tool_calls}, "
          f"policy tokens {ep.trajectory.num_policy_tokens}", file=sys.stderr)
    if args.out:
        with open(args.out, "w") as f:
            f.write(ep.trajectory.to_json())
    sys.stdout.write(ep.diff or "")
    if args.apply and ep.diff:
        r = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], input=ep.diff, text=True, cwd=args.repo,
                           capture_output=True)
        if r.returncode != 0:
            print(f"error: the diff does not apply to {args.repo}: {r.stderr.strip()}", file=sys.stderr)
            return 4
        print(f"applied to {args.repo}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
