"""Record llama.cpp's `llama-server` answers into tests/corpus/llamacpp (not run by the suite).

It makes a tiny random-weight GGUF (a llama-architecture model, a byte vocabulary, Qwen2.5's chat
template from the llama.cpp source tree), starts the `llama-server` given on 127.0.0.1 with it,
sends each request over a plain socket and keeps the answer's bytes: the status line and the
header lines as sent (less `Date`, and less the framing headers — `Content-Length`,
`Transfer-Encoding`, `Connection`, `Keep-Alive` — since the replaying fake frames the body itself),
a blank line, then the body exactly as sent (a chunked body de-chunked, nothing else touched).
Line ends in the head become `\\n`, as in every other `.http` file of the corpus.

How to build the server and re-record, and what the last recording used: README.md here.

Each model is made from a fixed seed, so the same llama.cpp makes the same answers (ids, times
and timings apart). Nothing here reaches beyond 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
TEMPLATE = "models/templates/Qwen-Qwen2.5-7B-Instruct.jinja"
SPECIAL = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
SPACE = "\u2581"  # SentencePiece's space: without a token of its own, a space is 3 byte tokens
TOOL_TAGS = ["<tool_call>", "</tool_call>"]  # Qwen2.5's, tokens of their own there too
TOKENS = [*SPECIAL, *(f"<0x{b:02X}>" for b in range(256)), SPACE, *TOOL_TAGS]
#: The output head's only design (token after → token next: how strongly): greedy decoding after
#: the generation prompt's last token, a newline, opens a tool call, and closes it and the turn.
#: The grammar llama-server makes for a required tool call lets text come first, and a random
#: head writes text to the token cap; where the grammar refuses the favourite, the runner-up is
#: taken (`{` after the newline, `}` after `}`), else whatever the random rest ranks first.
BIGRAMS = {
    ("<0x0A>", "<tool_call>"): 1.0,
    ("<0x0A>", "<0x7B>"): 0.5,
    ("<tool_call>", "<0x0A>"): 1.0,
    ("<0x7D>", "</tool_call>"): 1.0,
    ("<0x7D>", "<0x7D>"): 0.5,
    ("</tool_call>", "<|im_end|>"): 1.0,
    # and JSON without whitespace where the grammar allows it: the next mark, if it is allowed
    ("<0x7B>", "<0x22>"): 0.5,  # { "
    ("<0x22>", "<0x3A>"): 0.5,  # " :
    ("<0x22>", "<0x2C>"): 0.5,  # " ,
    ("<0x22>", "<0x7D>"): 0.5,  # " }
    ("<0x3A>", "<0x22>"): 0.5,  # : "
    ("<0x3A>", "<0x7B>"): 0.5,  # : {
    ("<0x2C>", "<0x22>"): 0.5,  # , "
}
DROPPED = {"date", "content-length", "transfer-encoding", "connection", "keep-alive"}
ALIAS = "tiny-random"
#: What the plain and streamed answers are held to: a GBNF grammar (llama-server's own `grammar`
#: field) makes a random model say one sentence and stop, so the answer is readable and ends
#: with `stop` rather than at the token cap.
SENTENCE = "Hello from a tiny random llama."
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def make_model(path: Path, template: str, *, n_embd: int, n_layer: int, n_ff: int) -> None:
    """A llama-architecture GGUF of random F32 weights (seed 43) but for `BIGRAMS`, added to its
    output head: the tokens `<unk> <s> </s> <|im_start|>
    <|im_end|>`, the 256 byte tokens `<0x00>`…`<0xFF>` (SentencePiece byte fallback, so any
    text tokenizes, one token per byte), `▁` (a space), and Qwen2.5's `<tool_call>` and
    `</tool_call>`; `<|im_end|>` ends a turn, and no space is put before a prompt (so the chat
    template's generation prompt tokenizes as written)."""
    import gguf  # type: ignore[import-not-found]  # in the recording venv, not the project's
    import numpy as np

    rng = np.random.default_rng(43)
    n_head, tokens = 4, TOKENS
    n_vocab = len(tokens)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("lanes tiny random llama")
    writer.add_context_length(4096)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(n_vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * n_vocab)
    kinds = [gguf.TokenType.UNKNOWN] + [gguf.TokenType.CONTROL] * 4
    bytes_, user = [gguf.TokenType.BYTE] * 256, [gguf.TokenType.USER_DEFINED] * len(TOOL_TAGS)
    writer.add_token_types([*kinds, *bytes_, gguf.TokenType.NORMAL, *user])
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(4)
    writer.add_add_bos_token(False)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(template)

    def weight(*shape: int, scale: float = 0.02) -> Any:
        return (rng.standard_normal(shape) * scale / shape[-1] ** 0.5).astype(np.float32)

    ones = np.ones(n_embd, dtype=np.float32)
    embeddings = weight(n_vocab, n_embd, scale=n_embd**0.5)  # rows of norm ~sqrt(n_embd)
    writer.add_tensor("token_embd.weight", embeddings)
    for i in range(n_layer):  # small beside the embeddings: the last token leads the answer
        writer.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"blk.{i}.{name}.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(n_embd, n_ff))
    writer.add_tensor("output_norm.weight", ones)
    head = weight(n_vocab, n_embd, scale=0.1)
    for (after, then), strength in BIGRAMS.items():
        row = embeddings[TOKENS.index(after)]
        head[TOKENS.index(then)] += strength * row / float(np.linalg.norm(row))
    writer.add_tensor("output.weight", head)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def exchange(port: int, method: str, path: str, body: Any = None) -> bytes:
    """One request on a fresh connection (closed after it); the answer's bytes as sent."""
    data = json.dumps(body).encode() if body is not None else b""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=300) as sock:
        sock.sendall(head.encode() + data)
        received = []
        while piece := sock.recv(65536):
            received.append(piece)
    return b"".join(received)


def dechunk(body: bytes) -> bytes:
    out, rest = [], body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out.append(rest[:size])
        rest = rest[size + 2 :]
    return b"".join(out)


def transcript(raw: bytes) -> bytes:
    """The corpus's `.http` form of one answer as sent (see the module docstring)."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    chunked = any(
        line.lower().startswith("transfer-encoding:") and "chunked" in line.lower()
        for line in lines
    )
    kept = [line for line in lines if line.split(":", 1)[0].strip().lower() not in DROPPED]
    return (
        "\n".join([status, *kept]).encode("latin-1")
        + b"\n\n"
        + (dechunk(body) if chunked else body)
    )


def status_of(answer: bytes) -> str:
    """The status line of an answer as sent, or of a transcript."""
    return answer.split(b"\n", 1)[0].rstrip(b"\r").decode("latin-1")


def save(name: str, raw: bytes) -> bytes:
    """Keep one answer (as sent, or already a transcript) as tests/corpus/llamacpp/`name`."""
    kept = raw if b"\r\n" not in raw.partition(b"\n\n")[0] else transcript(raw)
    (HERE / name).write_bytes(kept)
    print(f"  {name}: {status_of(kept)}")
    return kept


class Server:
    """`llama-server` on 127.0.0.1:`port` with `model` (and `extra` arguments), its log kept."""

    def __init__(self, binary: str, model: Path, port: int, log: Path, *extra: str) -> None:
        self.port = port
        command = [binary, "-m", str(model), "--alias", ALIAS, "--host", "127.0.0.1"]
        command += ["--port", str(port), "--threads", "2", "--seed", "43", *extra]
        self.command = command
        self.log = log.open("wb")
        self.started = time.monotonic()
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, within_s: float = 120.0) -> None:
        end = time.monotonic() + within_s
        while time.monotonic() < end:
            try:
                if b" 200 " in exchange(self.port, "GET", "/health").split(b"\r\n", 1)[0]:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"llama-server not ready within {within_s} s: {self.command}")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)
        self.log.close()


def chat(**extra: Any) -> dict[str, Any]:
    return {
        "model": ALIAS,
        "messages": [{"role": "user", "content": "Say hello."}],
        "temperature": 0,
        **extra,
    }


def record_answers(binary: str, model: Path, work: Path) -> dict[str, Any]:
    """The model list, a plain answer, a stream with usage, a tool call (plain and streamed), and
    the context overflow (plain; the streamed request's answer is compared with it)."""
    server = Server(binary, model, 18431, work / "answers.log", "--ctx-size", "2048", "-np", "1")
    notes: dict[str, Any] = {"command": server.command}
    try:
        server.wait_ready()
        post = lambda body: exchange(server.port, "POST", "/v1/chat/completions", body)  # noqa: E731
        grammar = {"grammar": f'root ::= "{SENTENCE}"'}
        usage = {"stream": True, "stream_options": {"include_usage": True}}
        save("models.json.http", exchange(server.port, "GET", "/v1/models"))
        save("text.json.http", post(chat(**grammar)))
        save("text.stream.http", post(chat(**usage, **grammar)))
        tools = chat(tools=[WEATHER], tool_choice="required", max_tokens=128)
        tools["messages"] = [{"role": "user", "content": "What is the weather in Paris?"}]
        save("tool-call.json.http", post(tools))
        save("tool-call.stream.http", post({**tools, **usage}))
        # byte tokens: 3,400 characters are ~3,400 tokens, over the 2,048 of --ctx-size
        long = chat(max_tokens=8)
        long["messages"] = [{"role": "user", "content": "lorem ipsum " * 283}]
        plain = save("context.error.http", post(long))
        streamed = transcript(post({**long, **usage}))
        notes["context_stream_same_bytes"] = streamed == plain
        if streamed != plain:
            save("context.stream.error.http", streamed)
    finally:
        server.stop()
    return notes


def record_loading(binary: str, model: Path, work: Path) -> dict[str, Any]:
    """What /health, /v1/models and /v1/chat/completions answer from the moment the port opens
    until the model is loaded: each asked in turn, over and over, until all three have answered
    200. Keeps the first loading answer of the chat and of the model list; returns the timings
    (seconds since the process started) and whether every loading answer had the same bytes."""
    # --load-mode none: the weights are read into memory, not mapped (a load to watch)
    server = Server(binary, model, 18432, work / "loading.log", "--load-mode", "none", "-np", "1")
    asks = {
        "health": ("GET", "/health", None),
        "models": ("GET", "/v1/models", None),
        "chat": ("POST", "/v1/chat/completions", chat(max_tokens=4)),
    }
    seen: dict[str, list[tuple[float, bytes]]] = {name: [] for name in asks}
    try:
        end = time.monotonic() + 300
        while time.monotonic() < end and not all(
            answers and " 200 " in status_of(answers[-1][1]) for answers in seen.values()
        ):
            if server.process.poll() is not None:
                raise RuntimeError(f"llama-server exited: see {work / 'loading.log'}")
            for name, (method, path, body) in asks.items():
                try:
                    raw = exchange(server.port, method, path, body)
                except OSError:
                    continue  # the port is not open yet
                seen[name].append((time.monotonic() - server.started, raw))
    finally:
        server.stop()
    notes: dict[str, Any] = {"command": server.command}
    for name, answers in seen.items():
        loading = [(t, transcript(raw)) for t, raw in answers if " 503 " in status_of(raw)]
        ready = [t for t, raw in answers if " 200 " in status_of(raw)]
        notes[name] = {
            "loading_answers": len(loading),
            "distinct_loading_transcripts": len({raw for _, raw in loading}),
            "first_loading_s": round(loading[0][0], 3) if loading else None,
            "last_loading_s": round(loading[-1][0], 3) if loading else None,
            "first_200_s": round(ready[0], 3) if ready else None,
        }
    save("loading.error.http", transcript(seen["chat"][0][1]))
    save("loading-models.error.http", transcript(seen["models"][0][1]))
    notes["health_same_bytes_as_chat"] = transcript(seen["health"][0][1]) == transcript(
        seen["chat"][0][1]
    )
    return notes


def record_busy(binary: str, model: Path, work: Path) -> dict[str, Any]:
    """--parallel 1 and two chat requests at once: is the second refused, or does it wait? And
    what the slots endpoint's `fail_on_no_slot` says while the one slot is busy (not kept: no
    lane asks it)."""
    server = Server(binary, model, 18433, work / "busy.log", "-np", "1", "--ctx-size", "4096")
    notes: dict[str, Any] = {"command": server.command}
    try:
        server.wait_ready()
        long = chat(max_tokens=400, ignore_eos=True)

        def ask(name: str) -> None:
            started = time.monotonic()
            raw = exchange(server.port, "POST", "/v1/chat/completions", long)
            notes[name] = {
                "status": status_of(raw),
                "sent_s": round(started - server.started, 3),
                "answered_s": round(time.monotonic() - server.started, 3),
            }

        threads = [threading.Thread(target=ask, args=(n,)) for n in ("first", "second")]
        threads[0].start()
        time.sleep(0.2)  # the first holds the one slot
        threads[1].start()
        time.sleep(0.2)
        slots = transcript(exchange(server.port, "GET", "/slots?fail_on_no_slot=1"))
        notes["slots_fail_on_no_slot"] = slots.decode()
        for thread in threads:
            thread.join()
    finally:
        server.stop()
    return notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", required=True, help="the llama-server binary")
    parser.add_argument(
        "--source", required=True, help="the llama.cpp source tree it was built from"
    )
    parser.add_argument("--work", required=True, help="a scratch folder for the models and logs")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    template = (Path(args.source) / TEMPLATE).read_text()
    tiny, big = work / "tiny-random.gguf", work / "loading-random.gguf"
    make_model(tiny, template, n_embd=256, n_layer=2, n_ff=512)
    # big enough (~0.8 GB of F32) that reading it (--load-mode none) takes a moment to watch
    make_model(big, template, n_embd=2048, n_layer=4, n_ff=5632)
    print(f"models: {tiny} ({tiny.stat().st_size} bytes), {big} ({big.stat().st_size} bytes)")
    notes: dict[str, Any] = {"answers": record_answers(args.server, tiny, work)}
    notes["loading"] = record_loading(args.server, big, work)
    notes["busy"] = record_busy(args.server, tiny, work)
    version = subprocess.run([args.server, "--version"], capture_output=True, text=True)
    notes["version"] = (version.stdout + version.stderr).strip()
    (work / "notes.json").write_text(json.dumps(notes, indent=1))
    print(json.dumps(notes, indent=1))


if __name__ == "__main__":
    main()
