"""docs/serve.md's and docs/export.md's blocks, and the README's two serve commands, run as
written by bash (python blocks by `python`), in one folder per doc, with `octlm` and `python`
this checkout's. The runs they name are tiny stand-ins: `runs/demo/split` the tiny model after
one step at context 256, `runs/talk` a micro chat fine-tune. Changed for the test: a server
(`octlm serve ...`) gets a free port (`--port N`, and the client's `:8000` becomes `:N`) and runs
in the background until the next server or the end. The blocks that need llama.cpp or Ollama
(not installed here) are not run: what they read (the GGUF files, the Modelfile) is checked."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from octlm.data.chat_format import JINJA_TEMPLATE
from tests.doc_blocks import run_block, shim, shim_env
from tests.e2e.helpers import octlm
from tests.rl.helpers import chat_source
from tests.serve.helpers import free_port, request, tiny_run

pytest.importorskip("uvicorn", reason="the serve extra is not installed")
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
EXTERNAL = {"llama-cli", "llama-server", "ollama"}
"""Commands octlm does not install: a block of them is checked, not run."""


def blocks(doc: Path) -> list[tuple[str, str]]:
    """(language, text) of each fenced block of `doc`, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```", doc.read_text(encoding="utf-8"), flags=re.S | re.M)


def commands(block: str) -> list[str]:
    """The first word of each command line of a bash block."""
    lines = re.sub(r"\\\n", " ", block).splitlines()
    return [line.split()[0] for line in lines if line.strip() and not line.startswith("#")]


@pytest.fixture()
def work(tmp_path, tiny_dataset, tiny_tokenizer, tmp_path_factory) -> Path:
    """A folder whose runs/demo/split and runs/talk are the tiny stand-ins."""
    folder = tmp_path / "work"
    (folder / "runs" / "demo").mkdir(parents=True)
    (folder / "runs" / "demo" / "split").symlink_to(tiny_run(tiny_dataset, tmp_path_factory))
    (folder / "runs" / "talk").symlink_to(chat_source(tiny_tokenizer, tmp_path_factory))
    return folder


@pytest.fixture()
def env(tmp_path) -> dict[str, str]:
    return shim_env(shim(tmp_path, "octlm", python=True), PYTHONPATH=str(ROOT))


@contextlib.contextmanager
def background(block: str, cwd: Path, env: dict[str, str], port: int) -> Iterator[None]:
    """`block` (a server) run by bash until the `with` ends; ready once /health answers."""
    proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", block], cwd=cwd, env=env,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"{block}\n{proc.stderr.read()}"
            with contextlib.suppress(OSError):
                if request(f"http://127.0.0.1:{port}", "GET", "/health")[0] == 200:
                    break
            assert time.monotonic() < deadline, f"{block} did not answer /health in 120 s"
            time.sleep(0.2)
        yield
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the session this test started: bash and octlm
        proc.wait(timeout=60)


def on_port(block: str, port: int) -> str:
    """`block` with its server on `port`, and its clients calling there."""
    block = re.sub(r"^(octlm serve \S+)", rf"\1 --port {port}", block, flags=re.M)
    return block.replace(":8000", f":{port}")


def external(lang: str, block: str) -> bool:
    """Whether `block` is one of commands octlm does not install (and only those)."""
    return lang == "bash" and bool(commands(block)) and set(commands(block)) <= EXTERNAL


def run_doc(doc: Path, work: Path, env: dict[str, str]) -> list[str]:
    """Every block of `doc` in order, a server in the background until the next: the output
    of each block run (not the servers', the synopsis' nor the external ones')."""
    outputs, port = [], free_port()
    with contextlib.ExitStack() as server:
        for n, (lang, text) in enumerate(blocks(doc)):
            text = on_port(text, port)
            if lang == "text" or external(lang, text):
                continue
            if lang == "bash" and text.startswith("octlm serve"):
                server.close()
                server.enter_context(background(text, work, env, port))
                continue
            assert lang in ("bash", "python"), f"a ```{lang} block: run it or mark it text"
            if lang == "python":
                (work / f"block{n}.py").write_text(text)
                text = f"python block{n}.py"
            outputs.append(run_block(text, work, env).stdout)
    return outputs


def test_the_serve_docs_blocks_run(work, env) -> None:
    doc = ROOT / "docs" / "serve.md"
    langs = [lang for lang, _ in blocks(doc)]
    assert langs == ["bash", "bash", "bash", "python"], langs  # demo, curl; talk, its client
    curl, _ = run_doc(doc, work, env)  # the client's script ran (the openai client raises on
    reply = json.loads(curl)  # an error answer), its reply streamed
    assert reply["object"] == "text_completion" and reply["model"] == "split"
    assert 0 < reply["usage"]["completion_tokens"] <= 40


def test_the_readmes_serve_commands_run(work, env) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    paragraph = readme.split("\nServe the demo model", 1)[1].split("\n\n", 1)[0]
    spans = re.findall(r"`([^`]+)`", paragraph.replace("\n", " "))
    serve, curl = [s for s in spans if s.startswith(("octlm serve", "curl"))]
    port = free_port()
    with background(on_port(serve, port), work, env, port):
        reply = json.loads(run_block(on_port(curl, port), work, env).stdout)
    assert reply["model"] == "split" and 0 < reply["usage"]["completion_tokens"] <= 40


def test_the_export_docs_blocks_run(work, env) -> None:
    gguf = pytest.importorskip("gguf", reason="the gguf extra is not installed")
    pytest.importorskip("transformers", reason="the hf extra is not installed")
    doc = ROOT / "docs" / "export.md"
    texts = blocks(doc)
    assert texts[0][0] == "text" and texts[0][1].startswith("octlm export RUN_OR_CKPT")
    assert [lang for lang, _ in texts].count("text") == 1  # only the synopsis is not run
    outputs = run_doc(doc, work, env)
    assert len(outputs) == 6  # hf export, its python; safetensors, its python; gguf; Modelfile
    greedy = octlm("generate", str(work / "runs/demo/split"), "--prompt", "ROMEO:",
                   "--max-new-tokens", "60", cwd=work)  # fmt: skip
    assert outputs[1] == greedy.stdout
    assert "parameters, data in " in outputs[3]
    llama, ollama = [b for lang, b in texts if external(lang, b)]
    for line in llama.splitlines():  # each model file it names reads back
        words = line.split()
        reader = gguf.GGUFReader(work / words[words.index("-m") + 1])
        assert reader.tensors and reader.fields["general.architecture"].contents() == "llama"
        if "--jinja" in words:  # llama.cpp's server applies the file's own template
            assert reader.fields["tokenizer.chat_template"].contents() == JINJA_TEMPLATE
    assert "-f Modelfile" in ollama
    check_modelfile(work / "Modelfile", gguf)


CONVERSATION = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 3 + 4?"},
                {"role": "assistant", "content": "7"},
                {"role": "user", "content": "And 2 + 2?"}]  # fmt: skip


def check_modelfile(path: Path, gguf) -> None:
    """The Modelfile's model reads back, its stop string is the model's EOS token, and its Go
    template renders a conversation as the model's Jinja chat template does."""
    import jinja2

    text = path.read_text(encoding="utf-8")
    reader = gguf.GGUFReader(path.parent / re.search(r"^FROM (\S+)$", text, re.M).group(1))
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    eos = tokens[reader.fields["tokenizer.ggml.eos_token_id"].contents()]
    assert re.findall(r'^PARAMETER stop "(.*)"$', text, re.M) == [eos] == ["<|eos|>"]
    template = re.search(r'^TEMPLATE """(.*?)"""$', text, re.S | re.M).group(1)
    jinja = jinja2.Environment().from_string(reader.fields["tokenizer.chat_template"].contents())
    expected = jinja.render(messages=CONVERSATION, bos_token="", eos_token=eos,
                            add_generation_prompt=True)  # fmt: skip
    assert render_go(template, CONVERSATION) == expected
    assert render_go(template.replace("}}\n{{", "}} {{"), CONVERSATION) != expected  # control


def render_go(template: str, messages: list[dict]) -> str:
    """Go's text/template for what the Modelfile's template uses: `{{-` trims the white space
    before it, and `{{ range .Messages }}...{{ end }}` repeats its body for each message, with
    `{{ .Role }}` and `{{ .Content }}` the message's."""
    template = re.sub(r"\s*\{\{-\s*", "{{ ", template)
    match = re.fullmatch(r"(.*?)\{\{ range \.Messages \}\}(.*?)\{\{ end \}\}(.*)", template,
                         flags=re.S)  # fmt: skip
    assert match, template
    head, body, tail = match.groups()
    each = [body.replace("{{ .Role }}", m["role"]).replace("{{ .Content }}", m["content"])
            for m in messages]  # fmt: skip
    assert "{{" not in head + "".join(each) + tail, template
    return head + "".join(each) + tail
