#!/usr/bin/env python3
"""serve_gpt against curl, a client written by others: starts `serve_gpt
--random --port 0`, reads the port from its 'listening on' line, then checks
with curl: a completion's JSON fields and usage counts; the same seed twice
gives the same text, and greedy / seeded text equals generate_gpt's with the
same weights, prompt and seed; a streamed completion (server-sent events,
then [DONE]) carries the same text; a stop sequence ends a choice and is left
out; 32 concurrent streamed requests each get the tokens they get alone; bad
requests get 400 (or 404, 405, 413) with OpenAI's error object naming the
field; a client that hangs up mid-stream leaves the server serving; SIGTERM
lets a streamed request in flight finish, and the server exits 0. A second
server with a draft (--draft-random of the target's own shape and seed: the
target as its own draft) answers the plain server's greedy text, streamed
in chunks of several tokens, with the same stops, concurrent requests too.
Servers with CaPE (the same draft, --cape) and with a random GliDe draft
(--glide --cape) answer the plain server's greedy text, concurrent requests
too, and refuse a sampled request with 400 naming the temperature.
Servers on rank threads (--tp 2, --tp 2 with the draft, --pp 2, --tp 2 --pp 2) and one with pooled blocks answer
concurrent streamed requests, greedy and seeded, with the plain server's
text, survive a client that hangs up mid-stream, and exit 0 on SIGTERM.

Standard library only. Run by ctest (examples/CMakeLists.txt):
  serve_gpt_curl.py --serve-gpt BIN --generate-gpt BIN --curl BIN
"""
import argparse
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time

SHAPE = ["--layers", "2", "--width", "64", "--heads", "4", "--seq", "64"]
SEED = "1"  # the weights' seed; requests that compare with generate_gpt sample with it too


def fail(message):
    print("FAIL: " + message, flush=True)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def printable(text):
    """The text as generate_gpt prints tokens: bytes 32..126 and newline as they are, others as '.'."""
    return "".join(c if c == "\n" or 32 <= ord(c) < 127 else "." for c in text)


class Server:
    def __init__(self, binary, extra=()):
        self.process = subprocess.Popen([binary, "--random", *SHAPE, "--seed", SEED, "--port", "0",
                                         "--max-batch", "4", "--block-size", "8", *extra],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.output = b""  # read from the pipe's descriptor itself: a buffered reader would hide lines from select
        deadline = time.time() + 20
        while time.time() < deadline:
            ready, _, _ = select.select([self.process.stdout], [], [], max(0.0, deadline - time.time()))
            more = os.read(self.process.stdout.fileno(), 4096) if ready else b""
            if not more:
                break
            self.output += more
            found = re.search(rb"serve_gpt: listening on (http://127\.0\.0\.1:(\d+))\n", self.output)
            if found:
                self.url, self.port = found.group(1).decode(), int(found.group(2))
                return
        self.process.kill()
        fail("serve_gpt printed no 'listening on' line:\n" + self.output.decode(errors="replace"))


def curl(args, url_path, body=None, method=None, extra=(), server=None):
    """(HTTP status, body text) of one curl call."""
    command = [args.curl, "-sS", "-w", "\n%{http_code}", *extra]
    if method:
        command += ["-X", method]
    if body is not None:
        command += ["-H", "Content-Type: application/json", "--data-binary", "@-"]  # stdin: no argv limit
        body = body if isinstance(body, str) else json.dumps(body)
    command.append((server or SERVER).url + url_path)
    done = subprocess.run(command, input=body, capture_output=True, text=True, timeout=30)
    check(done.returncode == 0, f"curl {url_path} failed ({done.returncode}): {done.stderr}")
    text, _, status = done.stdout.rpartition("\n")
    return int(status), text


def complete(args, request, server=None):
    status, text = curl(args, "/v1/completions", request, server=server)
    check(status == 200, f"{request} answered {status}: {text}")
    return json.loads(text)


def events_of(text):
    """The data of a server-sent event stream: parsed chunks, then the literal [DONE]."""
    check(text.endswith("\n\n"), "the stream does not end with a blank line: " + repr(text[-80:]))
    out = []
    for event in text.split("\n\n")[:-1]:
        check(event.startswith("data: "), "an event without 'data: ': " + repr(event))
        data = event[len("data: "):]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def stream_texts(events, choices):
    """Each choice's text and finish reason from a stream's chunks; checks their shape."""
    check(events and events[-1] == "[DONE]", "the stream does not end with [DONE]")
    texts, finishes = [""] * choices, [None] * choices
    for chunk in events[:-1]:
        check(chunk["object"] == "text_completion" and len(chunk["choices"]) == 1, f"a chunk of another shape: {chunk}")
        c = chunk["choices"][0]
        check(finishes[c["index"]] is None, f"choice {c['index']} has a chunk after its finish_reason")
        texts[c["index"]] += c["text"]
        finishes[c["index"]] = c["finish_reason"]
    check(all(f in ("stop", "length") for f in finishes), f"finish reasons {finishes}")
    return texts, finishes


def generate_gpt(args, prompt, max_new, sampling):
    done = subprocess.run([args.generate_gpt, "--random", *SHAPE, "--seed", SEED, "--prompt", prompt,
                           "--max-new", str(max_new), *sampling], capture_output=True, text=True, timeout=30)
    check(done.returncode == 0, "generate_gpt failed: " + done.stderr)
    found = re.search(r"--- completion 1: \d+ new tokens, finished at [a-z ]+ ---\n(.*)\ngenerated ", done.stdout, re.S)
    check(found, "generate_gpt printed no completion:\n" + done.stdout)
    check(found.group(1).startswith(prompt), "generate_gpt's text does not start with the prompt")
    return found.group(1)[len(prompt):]


def speculative(args, greedy, cat, stop, both, cut):
    """A server with a draft gives the plain server's greedy text: the target as its own draft
    (--draft-random of the target's shape and --seed), so every proposal is accepted and a stream's
    chunks carry several tokens; stops cut inside a round; concurrent requests wait for a slot."""
    spec = Server(args.serve_gpt, ["--draft-random", "--draft-layers", "2", "--draft-width", "64",
                                   "--draft-heads", "4", "--gamma", "3"])
    try:
        check(b"speculative decoding with gamma 3" in spec.output, "no speculative line:\n" + spec.output.decode())
        hello = {"prompt": "Hello", "max_tokens": 12, "temperature": 0}
        text = complete(args, hello, spec)["choices"][0]["text"]
        check(text == greedy, f"with a draft, greedy {text!r} is not the plain server's {greedy!r}")
        status, body = curl(args, "/v1/completions", {"prompt": ["Hello", "The cat"], "max_tokens": 12,
                                                      "temperature": 0, "stream": True}, extra=["-N"], server=spec)
        check(status == 200, f"with a draft, the stream answered {status}")
        events = events_of(body)
        check(stream_texts(events, 2) == ([greedy, cat], ["length", "length"]),
              f"with a draft, the streamed texts {stream_texts(events, 2)} are not {[greedy, cat]}")
        check(max(len(chunk["choices"][0]["text"]) for chunk in events[:-1]) == 4,
              "with the target as its own draft (gamma 3) no chunk carried 4 tokens")
        stopped = complete(args, dict(hello, stop=stop), spec)
        c = stopped["choices"][0]
        check(c["text"] == greedy[:greedy.find(stop)] and c["finish_reason"] == "stop" and
              stopped["usage"]["completion_tokens"] == greedy.find(stop) + 2, f"with a draft, stop {stop!r}: {stopped}")
        status, body = curl(args, "/v1/completions", dict(both, stream=True), server=spec)
        check(stream_texts(events_of(body), 1) == ([greedy[:cut]], ["stop"]), "with a draft, the streamed stops differ")
        seeded = {"prompt": "The cat", "max_tokens": 20, "temperature": 0.8, "seed": 5}
        check(complete(args, seeded, spec)["choices"][0]["text"] == complete(args, seeded, spec)["choices"][0]["text"],
              "with a draft, the same seed sampled other text")
        # 8 concurrent greedy requests on 4 slots (most wait for one): each the plain server's text.
        requests = [{"prompt": f"Draft {i}: ", "max_tokens": 40 + i, "temperature": 0} for i in range(8)]
        running = [subprocess.Popen([args.curl, "-sS", "-H", "Content-Type: application/json", "--data-binary",
                                     json.dumps(r), spec.url + "/v1/completions"], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for r in requests]
        outputs = [p.communicate(timeout=30) for p in running]
        for i, (p, (out, err)) in enumerate(zip(running, outputs)):
            check(p.returncode == 0, f"with a draft, concurrent request {i}: curl failed: {err}")
            plain = complete(args, requests[i])["choices"][0]["text"]
            check(json.loads(out)["choices"][0]["text"] == plain, f"with a draft, concurrent request {i} differs")
        spec.process.send_signal(signal.SIGTERM)
        code = spec.process.wait(timeout=20)
        output = (spec.output + spec.process.stdout.read()).decode(errors="replace")
        check(code == 0 and "accepted (100%)" in output, f"the server with a draft exited {code}:\n{output}")
        print(output.strip().splitlines()[-1])
    except BaseException:
        spec.process.kill()
        raise


def trees(args, greedy):
    """CaPE's trees (the target as its own draft, and a random 1-layer GliDe draft reading the target's
    cache): the plain server's greedy text, 6 concurrent greedy requests on 4 slots each the plain
    server's text, and a sampled request refused (CaPE's acceptance is greedy only)."""
    for extra in (["--draft-random", "--draft-layers", "2", "--draft-width", "64", "--draft-heads", "4",
                   "--gamma", "3", "--cape"],
                  ["--draft-random", "--draft-layers", "1", "--draft-width", "32", "--draft-heads", "2",
                   "--glide", "--cape", "--cape-bins", "2@0.5,1"]):
        server = Server(args.serve_gpt, extra)
        try:
            hello = {"prompt": "Hello", "max_tokens": 12, "temperature": 0}
            text = complete(args, hello, server)["choices"][0]["text"]
            check(text == greedy, f"with {extra}, greedy {text!r} is not the plain server's {greedy!r}")
            requests = [{"prompt": f"Tree {i}: ", "max_tokens": 20 + i, "temperature": 0} for i in range(6)]
            texts = stream_concurrently(args, server, requests)
            for i, r in enumerate(requests):
                plain = complete(args, r)["choices"][0]["text"]
                check(texts[i] == plain, f"with {extra}, concurrent request {i}: {texts[i]!r} is not {plain!r}")
            status, body = curl(args, "/v1/completions", dict(hello, temperature=0.7), server=server)
            error = json.loads(body).get("error", {}) if status == 400 else {}
            check(status == 400 and error.get("param") == "temperature" and "greedy only" in error.get("message", ""),
                  f"with {extra}, a sampled request answered {status}: {body}")
            stop_server(server, "accepted")
        except BaseException:
            server.process.kill()
            raise


def stream_concurrently(args, server, requests):
    """Each request's streamed text, all sent at once."""
    running = [subprocess.Popen([args.curl, "-sS", "-N", "-H", "Content-Type: application/json", "--data-binary",
                                 json.dumps(dict(r, stream=True)), server.url + "/v1/completions"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in requests]
    outputs = [p.communicate(timeout=30) for p in running]
    texts = []
    for i, (p, (out, err)) in enumerate(zip(running, outputs)):
        check(p.returncode == 0, f"concurrent request {i} to {server.url}: curl failed: {err}")
        texts.append(stream_texts(events_of(out), 1)[0][0])
    return texts


def hang_up_mid_stream(server):
    """A client that reads a stream's first event and hangs up."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        body = json.dumps({"prompt": "Bye", "max_tokens": 60, "stream": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        received = b""
        while b"data: " not in received:
            more = s.recv(4096)
            check(more, "the server closed the stream before its first event")
            received += more


def stop_server(server, expect):
    server.process.send_signal(signal.SIGTERM)
    code = server.process.wait(timeout=20)
    output = (server.output + server.process.stdout.read()).decode(errors="replace")
    check(code == 0 and expect in output, f"the server exited {code}:\n{output}")
    print(output.strip().splitlines()[-1])


def parallel(args, greedy, stop):
    """--tp 2 (two rank threads, each a shard; rank 0 broadcasts each step's submits and cancels), --pp 2
    (two stage threads; stage 0 admits requests into groups between steps) and both (two stages of two
    shards each; stage 0's tp rank 0 leads the other) and the whole model with both its blocks pooled and
    staged ahead (--pool-blocks 2) write the plain server's text: 12 concurrent streamed requests on 4 slots, greedy and seeded, joining and leaving
    the batch while others run; a stop sequence (a cancel every rank must apply); a client hanging up. With
    the draft, the greedy requests only: speculative sampling keeps the target's distribution, not its draws."""
    requests = [{"prompt": f"Rank {i}: ", "max_tokens": 10 + 3 * i, "temperature": 0} for i in range(8)]
    requests += [{"prompt": f"Seeded {i}", "max_tokens": 20, "temperature": 0.9, "seed": i} for i in range(4)]
    plain = stream_concurrently(args, SERVER, requests)
    stopped = {"prompt": "Hello", "max_tokens": 12, "temperature": 0, "stop": stop}
    plain_stopped = complete(args, stopped)["choices"][0]["text"]
    for extra, expect, asked in ((["--tp", "2"], "tensor-parallel on 2 rank threads", len(requests)),
                                 (["--pp", "2", "--prefill-tokens", "20"], "pipeline-parallel in 2 stages on rank threads",
                                  len(requests)),
                                 (["--tp", "2", "--pp", "2"], "pipeline-parallel in 2 stages on rank threads (4 in all)",
                                  len(requests)),
                                 (["--tp", "2", "--draft-random", "--draft-layers", "2", "--draft-width", "64",
                                   "--draft-heads", "4", "--gamma", "3"],
                                  "speculative decoding with gamma 3, tensor-parallel", 8),
                                 (["--pool-blocks", "2", "--prefetch", "1"],
                                  "weights: PooledGpt(2 blocks, pooled {0,1} in pool", len(requests))):
        server = Server(args.serve_gpt, extra)
        try:
            check(expect.encode() in server.output, f"no '{expect}' line:\n" + server.output.decode())
            texts = stream_concurrently(args, server, requests[:asked])
            for i, (text, alone) in enumerate(zip(texts, plain)):
                check(text == alone, f"{' '.join(extra)}: request {i} wrote {text!r}, the plain server {alone!r}")
            hang_up_mid_stream(server)
            text = complete(args, stopped, server)["choices"][0]["text"]
            check(text == plain_stopped, f"{' '.join(extra)}: the stop gave {text!r}, not {plain_stopped!r}")
            text = complete(args, {"prompt": "Hello", "max_tokens": 12, "temperature": 0}, server)["choices"][0]["text"]
            check(text == greedy, f"{' '.join(extra)}: after a client hung up, greedy {text!r} is not {greedy!r}")
            stop_server(server, "serve_gpt: stopped")
        except BaseException:
            server.process.kill()
            raise


def main():
    global SERVER
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve-gpt", required=True)
    parser.add_argument("--generate-gpt", required=True)
    parser.add_argument("--curl", required=True)
    args = parser.parse_args()
    SERVER = Server(args.serve_gpt)
    try:
        run(args)
    except BaseException:
        SERVER.process.kill()
        raise


def run(args):
    # A completion: OpenAI's fields, the model echoed, the usage counted.
    reply = complete(args, {"model": "my-model", "prompt": "Hello", "max_tokens": 12, "temperature": 0})
    check(reply["id"].startswith("cmpl-") and reply["object"] == "text_completion", f"id/object: {reply}")
    check(isinstance(reply["created"], int) and reply["model"] == "my-model", f"created/model: {reply}")
    choice = reply["choices"][0]
    check(len(reply["choices"]) == 1 and choice["index"] == 0 and choice["logprobs"] is None, f"choices: {reply}")
    check(choice["finish_reason"] == "length" and len(choice["text"]) == 12, f"choice: {choice}")
    check(reply["usage"] == {"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17}, f"usage: {reply}")
    greedy = choice["text"]

    # The same request, the same text; and generate_gpt's, greedy and sampled with the seed.
    again = complete(args, {"prompt": "Hello", "max_tokens": 12, "temperature": 0})["choices"][0]["text"]
    check(again == greedy, f"greedy twice: {again!r} then {greedy!r}")
    check(printable(greedy) == generate_gpt(args, "Hello", 12, ["--greedy"]),
          f"serve_gpt's greedy {printable(greedy)!r} is not generate_gpt --greedy's")
    sampled_request = {"prompt": "The cat", "max_tokens": 20, "temperature": 0.8, "top_k": 40, "top_p": 0.95,
                       "seed": int(SEED)}
    sampled = complete(args, sampled_request)["choices"][0]["text"]
    check(complete(args, sampled_request)["choices"][0]["text"] == sampled, "the same seed sampled other text")
    check(printable(sampled) == generate_gpt(args, "The cat", 20, ["--temperature", "0.8", "--top-k", "40",
                                                                  "--top-p", "0.95"]),
          f"serve_gpt's sampled {printable(sampled)!r} is not generate_gpt's with the same seed")
    other = complete(args, dict(sampled_request, seed=2))["choices"][0]["text"]
    check(other != sampled, "seed 2 sampled what seed 1 did")

    # Streamed: chunks then [DONE], two prompts as two choices, the text of the unstreamed reply.
    two = {"prompt": ["Hello", "The cat"], "max_tokens": 12, "temperature": 0}
    whole = complete(args, two)
    cat = complete(args, {"prompt": "The cat", "max_tokens": 12, "temperature": 0})["choices"][0]["text"]
    check([c["text"] for c in whole["choices"]] == [greedy, cat], "a list of prompts did not give each its own text")
    check(whole["usage"]["prompt_tokens"] == 12 and whole["usage"]["completion_tokens"] == 24, f"usage {whole}")
    status, text = curl(args, "/v1/completions", dict(two, stream=True), extra=["-N"])
    check(status == 200, f"stream answered {status}")
    events = events_of(text)
    texts, finishes = stream_texts(events, 2)
    check(texts == [c["text"] for c in whole["choices"]] and finishes == ["length", "length"],
          f"streamed {texts} {finishes} differ from {whole['choices']}")
    check(len(events) > 3, "the stream came in one chunk")

    # A stop sequence (two ASCII bytes of the greedy text): the choice ends there, without it.
    at = next((i for i in range(1, len(greedy) - 1) if ord(greedy[i]) < 128 and ord(greedy[i + 1]) < 128), None)
    check(at is not None, f"no two ASCII bytes in a row in {greedy!r}")
    stop = greedy[at:at + 2]
    stopped = complete(args, {"prompt": "Hello", "max_tokens": 12, "temperature": 0, "stop": ["\u0001zz", stop]})
    c = stopped["choices"][0]
    check(c["text"] == greedy[:greedy.find(stop)] and c["finish_reason"] == "stop", f"stop {stop!r}: {c}")
    check(stopped["usage"]["completion_tokens"] == greedy.find(stop) + 2, f"stop's usage: {stopped['usage']}")
    status, text = curl(args, "/v1/completions",
                        {"prompt": "Hello", "max_tokens": 12, "temperature": 0, "stop": stop, "stream": True})
    check(stream_texts(events_of(text), 1) == ([c["text"]], ["stop"]), "the streamed stop differs")
    # Two stops ending together ("Y" and "XY"): the text ends where the earlier one starts, and the
    # stream held "X" back until it knew.
    x, y = stop
    j = greedy.find(y)
    cut = j - 1 if j > 0 and greedy[j - 1] == x else j
    both = {"prompt": "Hello", "max_tokens": 12, "temperature": 0, "stop": [y, x + y]}
    check(complete(args, both)["choices"][0]["text"] == greedy[:cut], f"stops {[y, x + y]} did not cut at {cut}")
    status, text = curl(args, "/v1/completions", dict(both, stream=True))
    check(stream_texts(events_of(text), 1) == ([greedy[:cut]], ["stop"]), "the streamed stops differ")

    speculative(args, greedy, cat, stop, both, cut)
    trees(args, greedy)
    parallel(args, greedy, stop)

    # 32 concurrent streamed requests (4 slots: most wait for one, and join the batch as others
    # finish): each gets the text it gets alone.
    requests = [{"prompt": f"Request {i}: ", "max_tokens": 8 + i % 5, "temperature": 0.9, "seed": i, "stream": True}
                for i in range(32)]
    running = [subprocess.Popen([args.curl, "-sS", "-N", "-H", "Content-Type: application/json", "--data-binary",
                                 json.dumps(r), SERVER.url + "/v1/completions"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for r in requests]
    outputs = [p.communicate(timeout=30) for p in running]
    for i, (p, (out, err)) in enumerate(zip(running, outputs)):
        check(p.returncode == 0, f"concurrent request {i}: curl failed: {err}")
        texts, _ = stream_texts(events_of(out), 1)
        alone = complete(args, dict(requests[i], stream=False))["choices"][0]
        check(texts[0] == alone["text"] and len(alone["text"]) == 8 + i % 5,
              f"concurrent request {i}: {texts[0]!r}, alone {alone['text']!r}")

    # Bad requests: OpenAI's error object, naming the field and what is valid.
    def refused(body, status, message, param=None, method=None, path="/v1/completions"):
        got_status, text = curl(args, path, body, method=method)
        error = json.loads(text)["error"]
        check(got_status == status and error["message"] == message and error["param"] == param,
              f"{body!r} answered {got_status} {error}; expected {status} {message!r} (param {param})")
    refused('{"prompt": "Hi",', 400,
            "the request body is not valid JSON: expected a string key in an object but found the end of the text "
            "at byte 16")
    refused([1, 2], 400, "the request body is an array; give a JSON object")
    refused({"max_tokens": 3}, 400, "prompt is missing; give a string or a list of strings", "prompt")
    refused({"prompt": ["a", 7]}, 400, "prompt[1] is a number; give a string or a list of strings", "prompt")
    refused({"prompt": []}, 400, "prompt is an empty list; give a string or a list of strings", "prompt")
    refused({"prompt": ["a", ""]}, 400, "prompt[1] is an empty string; give at least one byte", "prompt")
    refused({"prompt": ["a", "y" * 70]}, 400,
            "prompt[1] has 70 tokens, more than the model's context of 64 (--seq); give at most 64", "prompt")
    refused({"prompt": "Hello", "model": 3}, 400, "model is a number; give a string", "model")
    refused({"prompt": "Hello", "stop": ["a", 1]}, 400, "stop[1] is a number; give a string or a list of strings",
            "stop")
    refused({"prompt": "Hello", "echo": True}, 400, "echo true is not supported; give false", "echo")
    refused({"prompt": "Hello", "logprobs": 2}, 400, "logprobs 2 is not supported; give null", "logprobs")
    refused({"prompt": "Hello", "max_tokens": 2.5}, 400, "max_tokens 2.5 is not valid; give a whole number >= 1",
            "max_tokens")
    refused({"prompt": "x" * 65}, 400,
            "prompt has 65 tokens, more than the model's context of 64 (--seq); give at most 64", "prompt")
    refused({"prompt": "Hello", "max_tokens": 61}, 400,
            "max_tokens 61 is too large: the 5-token prompt and 61 new tokens need more than the model's context of "
            "64 (--seq); give max_tokens <= 60", "max_tokens")
    refused({"prompt": "Hello", "max_tokens": 0}, 400, "max_tokens 0 is not valid; give a whole number >= 1",
            "max_tokens")
    refused({"prompt": "Hello", "temperature": -1}, 400,
            "temperature -1 is not valid; give a number >= 0 (0: the most likely token every step)", "temperature")
    refused({"prompt": "Hello", "top_p": 0}, 400, "top_p 0 is not valid; give a number in (0, 1] (1 keeps every token)",
            "top_p")
    refused({"prompt": "Hello", "top_k": 300}, 400,
            "top_k 300 is not valid; give a whole number in 0..256 (0 keeps every token)", "top_k")
    refused({"prompt": "Hello", "seed": -3}, 400, "seed -3 is not valid; give a whole number >= 0", "seed")
    refused({"prompt": "Hello", "stop": ""}, 400, "stop is an empty string; give at least one byte", "stop")
    refused({"prompt": "Hello", "stream": "yes"}, 400, "stream is a string; give true or false", "stream")
    refused({"prompt": "Hello", "n": 2}, 400,
            "n 2 is not supported; give 1 (a list of prompts gives several choices)", "n")
    refused(None, 404, "no such path: /v1/chat/completions; the server answers POST /v1/completions, GET /v1/models "
            "and GET /health", path="/v1/chat/completions")
    refused(None, 405, "GET /v1/completions is not served; use POST /v1/completions")
    refused(None, 405, "DELETE /health is not served; use GET /health", method="DELETE", path="/health")
    big = json.dumps({"prompt": "x" * (1 << 20)})
    refused(big, 413, "the request body is larger than the server's limit of 1048576 bytes")
    # A client that waits for 100 Continue before its body gets it (curl -v shows the interim response).
    asked = subprocess.run([args.curl, "-sS", "-v", "--expect100-timeout", "30", "-H", "Expect: 100-continue",
                            "-H", "Content-Type: application/json", "--data-binary", "@-",
                            SERVER.url + "/v1/completions"],
                           input=json.dumps({"prompt": "Hello", "max_tokens": 12, "temperature": 0}),
                           capture_output=True, text=True, timeout=60)
    check("< HTTP/1.1 100 Continue" in asked.stderr and json.loads(asked.stdout)["choices"][0]["text"] == greedy,
          f"Expect: 100-continue: {asked.stderr} {asked.stdout}")
    status, text = curl(args, "/v1/models")
    check(status == 200 and json.loads(text)["data"][0]["id"] == "loom-gpt", f"/v1/models: {status} {text}")

    # A request that is not HTTP: 400 with the error object, and the connection closed.
    with socket.create_connection(("127.0.0.1", SERVER.port), timeout=10) as s:
        s.sendall(b"HELLO there\r\n\r\n")
        answer = b""
        while True:
            more = s.recv(4096)
            if not more:
                break
            answer += more
    head, _, body = answer.partition(b"\r\n\r\n")
    check(head.startswith(b"HTTP/1.1 400 Bad Request") and
          json.loads(body)["error"]["message"].startswith("the request is not valid HTTP/1.1: "),
          f"a request that is not HTTP was answered {answer!r}")

    # A client that hangs up mid-stream: the server goes on serving.
    hang_up_mid_stream(SERVER)
    check(complete(args, {"prompt": "Hello", "max_tokens": 12, "temperature": 0})["choices"][0]["text"] == greedy,
          "after a client hung up, the server's greedy text changed")
    status, text = curl(args, "/health")
    check(status == 200 and json.loads(text) == {"status": "ok"}, f"/health: {status} {text}")

    # SIGTERM while a stream is in flight: it finishes ([DONE]) and the server exits 0.
    late = subprocess.Popen([args.curl, "-sS", "-N", "-H", "Content-Type: application/json", "--data-binary",
                             json.dumps({"prompt": "Last", "max_tokens": 60, "stream": True}),
                             SERVER.url + "/v1/completions"], stdout=subprocess.PIPE, text=True)
    first = late.stdout.readline()
    check(first.startswith("data: "), f"the last stream began with {first!r}")
    SERVER.process.send_signal(signal.SIGTERM)
    rest = late.stdout.read()
    late.wait(timeout=20)
    texts, finishes = stream_texts(events_of(first + rest), 1)
    check(finishes == ["length"] and len(texts[0]) == 60, f"the stream in flight at SIGTERM: {finishes} {texts}")
    try:
        code = SERVER.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        fail("serve_gpt did not exit within 20 s of SIGTERM")
    output = (SERVER.output + SERVER.process.stdout.read()).decode(errors="replace")
    check(code == 0 and "serve_gpt: stopped" in output, f"serve_gpt exited {code}:\n{output}")
    print(output.strip().splitlines()[-1])
    with socket.socket() as s:
        check(s.connect_ex(("127.0.0.1", SERVER.port)) != 0, "the port still accepts after the server exited")
    print("serve_gpt answered curl as OpenAI's API does: completions, streams, 32 at once, errors, SIGTERM")


if __name__ == "__main__":
    main()
