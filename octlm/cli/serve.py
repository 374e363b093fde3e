"""`octlm serve RUN`: the trained model behind an OpenAI-compatible API and a chat page
(`octlm/serve/`, docs/serve.md); needs the `serve` extra."""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from pathlib import Path
from typing import Any

from octlm.config import checks
from octlm.extras import require

API_KEY_ENV = "OCTLM_API_KEY"


def add_serve_command(sub: Any, run_parser: Any) -> None:
    se = run_parser(sub, "serve", "the model behind an OpenAI-compatible API and a chat page")
    se.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    se.add_argument("--port", type=int, default=8000)
    se.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"require `Authorization: Bearer KEY` on /v1/ (default: ${API_KEY_ENV}, if set)",
    )
    se.add_argument("--name", help="the model's name in the API (default: the run's folder)")
    se.add_argument("--data", help="dataset folder whose tokenizer and chat format to use")
    se.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    se.add_argument("--max-batch", type=int, default=32, help="rows decoded together at most")
    se.add_argument("--timeout", type=float, default=300.0, help="seconds a request may take")
    se.add_argument("--max-body", type=int, default=1 << 20, help="bytes a request body may hold")
    se.set_defaults(handler=cmd_serve)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cmd_serve(args: argparse.Namespace) -> int:
    require("starlette", "octlm serve")
    require("uvicorn", "octlm serve")
    checks.check("--port", args.port, checks.Int(0, 65535), "use a port from 0 to 65535")
    checks.check("--max-batch", args.max_batch, checks.Int(1), "use 1 or more")
    checks.check("--max-body", args.max_body, checks.Int(1024), "use 1024 bytes or more")
    checks.check("--timeout", args.timeout, checks.Number(0, lo_open=True), "use seconds > 0")
    from octlm.data.chat_format import check_template_version
    from octlm.generation.trained import load_model, run_dataset, run_tokenizer
    from octlm.serve.app import Served, run_server
    from octlm.serve.batching import Scheduler

    model, info = load_model(args.run, device=args.device)
    manifest = run_dataset(info, args.data).manifest
    chat = "chat_template" in manifest
    if chat:
        check_template_version(manifest["chat_template"].get("version"), f"{args.run}'s dataset")
    name = args.name or Path(os.path.abspath(args.run)).name  # a link by its own name
    scheduler = Scheduler(model, max_batch=args.max_batch)
    served = Served(name, run_tokenizer(info, args.data), scheduler, chat, args.api_key,
                    args.timeout, args.max_body)  # fmt: skip
    if not is_loopback(args.host) and not args.api_key:
        print(
            f"octlm: warning: serving on {args.host} without --api-key: anyone who can reach "
            "this address can use the model",
            file=sys.stderr,
            flush=True,
        )
    kind = "chat and completions" if chat else "completions only (no chat format)"
    where = f"http://{args.host}:{args.port}/"
    print(f"serving {name} (context {served.context}, {kind}) at {where}", flush=True)
    run_server(served, args.host, args.port)
    return 0
