"""`python -m c2jax.serve --checkpoint PATH [--host 127.0.0.1] [--port 8000]`: an OpenAI-compatible
API (/v1/models, /v1/chat/completions with tools, streaming and logprobs) for a c2jax checkpoint.

Binds to 127.0.0.1 unless --host says otherwise. See c2jax/sampling/checkpoint.py for what PATH holds.
"""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m c2jax.serve", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="serving checkpoint directory")
    ap.add_argument("--tokenizer", help="tokenizer.json (default: CHECKPOINT/tokenizer.json)")
    ap.add_argument("--model-preset", help="model preset for an Orbax checkpoint without model.json")
    ap.add_argument("--model-name", default="c2jax", help="the model id clients ask for")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0 = any free port (printed)")
    ap.add_argument("--max-slots", type=int, default=8, help="concurrent sequences")
    ap.add_argument("--max-len", type=int, default=4096, help="tokens per sequence (prompt + completion)")
    ap.add_argument("--max-tokens", type=int, default=512,
                    help="max_tokens of a request that sets none (at most the room its prompt leaves)")
    args = ap.parse_args(argv)

    from c2jax.data.chat_format import ChatFormat
    from c2jax.sampling import Engine, EngineConfig
    from c2jax.sampling.checkpoint import ServeCheckpointError, load_serving_checkpoint
    from c2jax.serve.server import ChatServer

    try:
        params, cfg, tok = load_serving_checkpoint(args.checkpoint, args.tokenizer, args.model_preset)
        engine = Engine(params, cfg, EngineConfig(max_slots=args.max_slots, max_len=args.max_len), tokenizer=tok)
    except (ServeCheckpointError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    srv = ChatServer(engine, ChatFormat(tok), model_name=args.model_name, default_max_tokens=args.max_tokens)
    srv.start(args.host, args.port)
    print(f"serving {args.model_name!r} at {srv.url}/v1", flush=True)
    try:
        import threading

        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        srv.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
