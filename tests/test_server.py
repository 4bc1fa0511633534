"""orkpy's OpenAI-compatible server (orkpy.server, `orkpy serve`; docs/server.md), on loopback.

- the protocol and the engine without HTTP: the request checks (a 400 naming the field), stop
  sequences across token boundaries and held back while streaming, the context limit;
- the server (uvicorn in a thread) with the official ``openai`` client: /v1/models,
  completions and chat completions (= orkpy's own greedy generation, streamed and not), a stop
  sequence, bad requests (the API's JSON error shape, 4xx), the context limit, two concurrent
  clients (each gets what it gets alone), a client that disconnects mid-stream (its generation
  stops, the next request is served), the API key;
- raw HTTP: invalid JSON, unknown routes, the event stream's framing;
- ``orkpy serve`` as a user runs it (a subprocess on a free port), and SmolLM2's chat template.

stories260K with a ChatML ``tokenizer.chat_template`` added (its vocabulary has no ChatML
tokens: the markers are plain text to it, which is all the plumbing needs).
"""
import http.client
import json
import socket
import subprocess
import sys
import threading
import time

import pytest

import orkpy
from orkpy.formats.gguf import GGUFFile
from orkpy.formats.gguf_write import metadata_triples, write_gguf
from orkpy.server import protocol as P
from orkpy.server.engine import Engine, Job, StopScanner

openai = pytest.importorskip("openai")  # the test extra installs it (pyproject.toml): CI never skips
uvicorn = pytest.importorskip("uvicorn")

ST = "models/stories260K/stories260K-F32.gguf"
CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
PROMPT = "Once upon a time"


# ------------------------------------------------------------- no HTTP --
def test_stop_scanner_cuts_at_the_first_stop_across_pieces():
    s = StopScanner(["END", "xy"])
    assert s.push("ab") == "ab"
    assert s.push("cE") == "c"          # "E" may start "END": held back
    assert s.push("N") == ""            # "EN" still may
    assert s.push("Dzz") == "" and s.stopped
    assert s.push("more") == "" and s.flush() == ""
    s = StopScanner(["END"])
    assert s.push("aE") == "a" and s.push("x") == "Ex"   # not a stop after all: released
    assert s.push("E") == "" and s.flush() == "E"          # the end of the text releases it
    s = StopScanner(["b", "abc"])
    assert s.push("xab") == "xa" and s.stopped             # the earliest occurrence wins
    assert StopScanner([]).push("anything") == "anything"


def test_sampling_fields_checked_with_the_field_named():
    s = P.sampling({}, chat=False)
    assert (s.max_tokens, s.temperature, s.top_k, s.top_p, s.stop, s.stream) == (None, 0.8, 40, 0.95, [], False)
    s = P.sampling({"max_tokens": 5, "max_completion_tokens": 7, "temperature": 0, "top_k": 0, "top_p": 1,
                    "seed": 3, "stop": "x", "stream": True}, chat=True)
    assert (s.max_tokens, s.temperature, s.top_k, s.top_p, s.seed, s.stop, s.stream) == (7, 0.0, 0, 1.0, 3, ["x"], True)
    assert P.sampling({"n_predict": -1}, chat=False).max_tokens is None
    assert P.sampling({"n": 1, "echo": False, "logprobs": None, "presence_penalty": 0}, chat=False).top_k == 40
    for body, param in [({"temperature": -1}, "temperature"), ({"temperature": "hot"}, "temperature"),
                        ({"top_p": 0}, "top_p"), ({"top_k": -2}, "top_k"), ({"max_tokens": -1}, "max_tokens"),
                        ({"max_tokens": True}, "max_tokens"), ({"seed": -5}, "seed"), ({"stop": [1]}, "stop"),
                        ({"stream": "yes"}, "stream"), ({"n": 2}, "n"), ({"echo": True}, "echo"),
                        ({"logprobs": 3}, "logprobs"), ({"presence_penalty": 0.5}, "presence_penalty"),
                        ({"response_format": {"type": "json_object"}}, "response_format")]:
        with pytest.raises(P.APIError) as e:
            P.sampling(body, chat=False)
        assert e.value.status == 400 and e.value.param == param, body
        assert e.value.body()["error"]["type"] == "invalid_request_error"


def test_prompts_and_messages_checked():
    assert P.completion_prompt({"prompt": "hi"}) == "hi"
    assert P.completion_prompt({"prompt": ["hi"]}) == "hi"
    assert P.completion_prompt({"prompt": [1, 2]}) == [1, 2]
    assert P.completion_prompt({"prompt": [[1, 2]]}) == [1, 2]
    for p in (None, "", [], ["a", "b"], [1, "x"], {"a": 1}, [True]):
        with pytest.raises(P.APIError, match="prompt"):
            P.completion_prompt({"prompt": p})
    msgs = P.chat_messages({"messages": [{"role": "developer", "content": "Be brief."},
                                         {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                      {"type": "text", "text": "b"}]}]})
    assert msgs == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "ab"}]
    for ms, param in [(None, "messages"), ([], "messages"), (["x"], "messages[0]"),
                      ([{"role": "tool", "content": "x"}], "messages[0].role"),
                      ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages[0].content"),
                      ([{"role": "user"}], "messages[0].content")]:
        with pytest.raises(P.APIError) as e:
            P.chat_messages({"messages": ms})
        assert e.value.param == param
    with pytest.raises(P.APIError, match="not valid JSON"):
        P.parse_body(b"{nope")
    with pytest.raises(P.APIError, match="JSON object"):
        P.parse_body(b"[1]")


@pytest.fixture(scope="module")
def chat_model(shared, tmp_path_factory):
    """stories260K with a ChatML chat template (module doc)."""
    g = GGUFFile(shared / ST)
    path = tmp_path_factory.mktemp("srv") / "stories-chatml.gguf"
    write_gguf(path, metadata_triples(g) + [("tokenizer.chat_template", "STRING", CHATML)],
               [(t.name, g.tensor(t.name)) for t in g.tensors])
    return orkpy.load_model(path)


def test_job_context_limit_and_finish_reasons(chat_model):
    ids = chat_model.tokens(PROMPT)
    n = len(ids)
    with pytest.raises(P.APIError) as e:
        Job(chat_model, ids, P.Sampling(max_tokens=10, temperature=0), n_ctx=n + 8, threads=1)
    assert e.value.code == "context_length_exceeded" and f"{n} tokens" in e.value.message
    with pytest.raises(P.APIError, match="no room"):
        Job(chat_model, ids, P.Sampling(temperature=0), n_ctx=n, threads=1)
    j = Job(chat_model, ids, P.Sampling(max_tokens=9, temperature=0), n_ctx=n + 8, threads=1)  # fits exactly
    assert j.run() == chat_model.generate(ids, 9, temperature=0)
    assert (j.finish_reason, j.completion_tokens) == ("length", 9)
    j = Job(chat_model, ids, P.Sampling(temperature=0), n_ctx=n + 11, threads=1)  # until the context is full
    assert j.run() == chat_model.generate(ids, 12, temperature=0) and j.completion_tokens == 12
    eng = Engine(chat_model, 64)
    with pytest.raises(P.APIError, match="outside the vocabulary"):
        eng.prompt_ids([1, chat_model.n_vocab])


# ----------------------------------------------------------- the server --
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    """uvicorn serving ``app`` on a free loopback port, in a thread."""

    def __init__(self, app):
        self.app, self.port = app, _free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            assert time.monotonic() - t0 < 30 and self.thread.is_alive(), "the server did not start"
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{self.port}"

    def client(self, key="none"):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=60)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def server(chat_model):
    from orkpy.server import create_app
    s = _Server(create_app(chat_model, alias="stories", threads=1))
    yield s
    s.stop()


def _raw(server, method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    c.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    r = c.getresponse()
    out = r.status, r.getheader("content-type"), r.read()
    c.close()
    return out


def test_models_and_health(server):
    got = server.client().models.list()
    assert [m.id for m in got.data] == ["stories"] and got.data[0].owned_by == "orkpy"
    assert _raw(server, "GET", "/health")[0] == 200


def test_completion_equals_orkpys_generation_streamed_or_not(server, chat_model):
    c = server.client()
    want = chat_model.generate(PROMPT, 24, temperature=0)
    r = c.completions.create(model="stories", prompt=PROMPT, max_tokens=24, temperature=0)
    assert r.choices[0].text == want and r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(chat_model.tokens(PROMPT)), 24)
    chunks = list(c.completions.create(model="stories", prompt=PROMPT, max_tokens=24, temperature=0, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == want and len(chunks) > 3
    assert chunks[-1].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == 24
    # token ids as the prompt, and sampling: the same seed, the same text
    ids = [int(t) for t in chat_model.tokens(PROMPT)]
    assert c.completions.create(model="x", prompt=ids, max_tokens=24, temperature=0).choices[0].text == want
    a, b = (c.completions.create(model="x", prompt=PROMPT, max_tokens=16, temperature=1.0, seed=7).choices[0].text
            for _ in range(2))
    assert a == b == chat_model.generate(PROMPT, 16, temperature=1.0, top_k=40, top_p=0.95, seed=7)


def test_chat_completion_in_the_template_streamed_or_not(server, chat_model):
    c = server.client()
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story."}]
    text = orkpy.runtime.generate.apply_chat_template("chatml", msgs)
    ids = chat_model.tokenizer.encode(text, add_special=True, parse_special=True)
    want = chat_model.generate(ids, 20, temperature=0)
    r = c.chat.completions.create(model="stories", messages=msgs, max_tokens=20, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == want
    assert r.usage.prompt_tokens == len(ids)
    chunks = list(c.chat.completions.create(model="stories", messages=msgs, max_tokens=20, temperature=0,
                                            stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_sequence(server, chat_model):
    c = server.client()
    full = chat_model.generate(PROMPT, 40, temperature=0)
    stop = full[12:16]   # inside the text, likely across a token boundary
    cut = full[:full.index(stop)]
    r = c.completions.create(model="stories", prompt=PROMPT, max_tokens=40, temperature=0, stop=[stop, "\x00never"])
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
    chunks = list(c.completions.create(model="stories", prompt=PROMPT, max_tokens=40, temperature=0, stop=stop,
                                       stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == cut and chunks[-1].choices[0].finish_reason == "stop"


def test_bad_requests_are_4xx_in_the_apis_error_shape(server, chat_model):
    c = server.client()
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="stories", prompt=PROMPT, max_tokens=4, top_p=0)
    assert e.value.status_code == 400 and e.value.body["param"] == "top_p"
    with pytest.raises(openai.BadRequestError) as e:   # the context limit (the model's 2048 training positions)
        c.completions.create(model="stories", prompt=PROMPT, max_tokens=4000)
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError, match="messages"):
        c.chat.completions.create(model="stories", messages=[], max_tokens=4)
    status, ctype, body = _raw(server, "POST", "/v1/completions", b"{not json")
    assert status == 400 and ctype == "application/json" and "not valid JSON" in json.loads(body)["error"]["message"]
    status, _, body = _raw(server, "GET", "/v1/nope")
    assert status == 404 and json.loads(body)["error"]["type"] == "not_found_error"
    status, _, body = _raw(server, "GET", "/v1/completions")
    assert status == 405 and set(json.loads(body)["error"]) == {"message", "type", "param", "code"}


def test_raw_event_stream_framing(server):
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": PROMPT, "max_tokens": 5, "temperature": 0,
                                                          "stream": True}), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("content-type").startswith("text/event-stream")
    events = [e for e in r.read().decode().split("\n\n") if e]
    c.close()
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    last = json.loads(events[-2][6:])
    assert last["choices"][0]["finish_reason"] == "length" and last["usage"]["completion_tokens"] == 5


def test_two_concurrent_clients_each_get_their_own_answer(server, chat_model):
    prompts = [PROMPT, "Tom had a red ball. He"]
    want = [chat_model.generate(p, 60, temperature=0) for p in prompts]
    got = [None, None]
    errors = []

    def ask(i):
        try:
            c = server.client()
            if i == 0:
                got[i] = "".join(ch.choices[0].text for ch in c.completions.create(
                    model="x", prompt=prompts[i], max_tokens=60, temperature=0, stream=True))
            else:
                got[i] = c.completions.create(model="x", prompt=prompts[i], max_tokens=60, temperature=0).choices[0].text
        except Exception as e:  # noqa: BLE001 -- reported by the assertion below
            errors.append(e)
    for _ in range(3):
        ts = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        assert not errors and got == want


def test_a_client_gone_mid_stream_stops_its_generation(server, chat_model):
    eng = server.app.state.engine
    before = len(eng.history)
    s = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    body = json.dumps({"prompt": PROMPT, "temperature": 1.0, "seed": 1, "stream": True}).encode()  # to a full context
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while b"data: " not in got:
        got += s.recv(4096)
    s.close()   # gone after the first event
    t0 = time.monotonic()
    while len(eng.history) == before or eng.active:
        assert time.monotonic() - t0 < 60, "the request never ended"
        time.sleep(0.01)
    rec = eng.history[-1]
    room = eng.n_ctx - rec["prompt_tokens"] + 1
    assert rec["finish_reason"] == "cancelled" and rec["completion_tokens"] < room
    r = server.client().completions.create(model="x", prompt=PROMPT, max_tokens=3, temperature=0)   # still serving
    assert r.choices[0].text == chat_model.generate(PROMPT, 3, temperature=0)


def test_api_key(chat_model):
    from orkpy.server import create_app
    s = _Server(create_app(chat_model, api_key="s3cret", n_ctx=64))
    try:
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").models.list()
        assert s.client("s3cret").completions.create(model="x", prompt=PROMPT, max_tokens=2,
                                                     temperature=0).usage.completion_tokens == 2
        assert _raw(s, "GET", "/health")[0] == 200
        with pytest.raises(openai.BadRequestError, match="context"):   # n_ctx = 64
            s.client("s3cret").completions.create(model="x", prompt=PROMPT, max_tokens=64)
    finally:
        s.stop()


def test_chat_without_a_template_is_a_400(shared):
    from orkpy.server import create_app
    s = _Server(create_app(orkpy.load_model(shared / ST)))
    try:
        with pytest.raises(openai.BadRequestError, match="no chat template"):
            s.client().chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    finally:
        s.stop()


# -------------------------------------------------------- orkpy serve --
@pytest.mark.slow
def test_orkpy_serve_as_a_user_runs_it(shared):
    port = _free_port()
    p = subprocess.Popen([sys.executable, "-m", "orkpy", "serve", str(shared / ST), "--port", str(port), "-t", "1",
                          "--alias", "tiny"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=30)
        t0 = time.monotonic()
        while True:
            try:
                ids = [m.id for m in c.models.list().data]
                break
            except openai.APIConnectionError:
                assert p.poll() is None and time.monotonic() - t0 < 60, p.stderr.read() if p.poll() is not None else ""
                time.sleep(0.1)
        assert ids == ["tiny"]
        want = orkpy.load_model(shared / ST).generate(PROMPT, 8, temperature=0)
        assert c.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text == want
    finally:
        p.terminate()
        _, err = p.communicate(timeout=30)
    assert "orkpy serve:" in err and f"127.0.0.1:{port}/v1" in err


def test_serve_without_the_extra_says_how_to_get_it(monkeypatch, capsys, shared):
    from orkpy import cli
    monkeypatch.setitem(sys.modules, "uvicorn", None)   # import uvicorn -> ImportError
    assert cli.main(["serve", str(shared / ST)]) == 2
    assert "pip install 'orkpy[serve]'" in capsys.readouterr().err


def test_serve_rejects_a_bad_port(capsys):
    from orkpy import cli
    with pytest.raises(SystemExit) as e:
        cli.main(["serve", "m.gguf", "--port", "70000"])
    assert e.value.code == 2 and "0 .. 65535" in capsys.readouterr().err


@pytest.mark.slow
def test_smollm2_chat_through_the_server():
    from oracle import real_model

    from orkpy.server import create_app
    m = orkpy.load_model(real_model("smollm2"))
    s = _Server(create_app(m, alias="smollm2", n_ctx=256))
    try:
        q = "What is the capital of France?"
        r = s.client().chat.completions.create(model="smollm2", messages=[{"role": "user", "content": q}],
                                               max_tokens=24, temperature=0)
        assert r.choices[0].message.content == m.generate(q, 24, temperature=0, chat=True)
        assert "Paris" in r.choices[0].message.content
    finally:
        s.stop()
