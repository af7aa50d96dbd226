"""Drives a Tidal gateway with the official `openai` Python client, unchanged.

Usage: python openai_client_check.py BASE_URL API_KEY MODEL
The model must be served by the fake worker (tidal_gateway::fake_worker), which echoes the
last message's words back, so every answer is known. Prints one line per check and exits
non-zero on the first failure.
"""

import sys

import openai
from openai import OpenAI


def check(name, cond, detail=""):
    if not cond:
        print(f"FAIL {name}: {detail}", flush=True)
        sys.exit(1)
    print(f"ok   {name}", flush=True)


def main():
    base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
    client = OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=30)

    models = client.models.list()
    ids = [m.id for m in models.data]
    check("models.list", model in ids, ids)

    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello from python"}]
    )
    check("chat non-streaming", r.choices[0].message.content == "hello from python", r)
    check("chat finish_reason", r.choices[0].finish_reason == "stop", r)
    check("chat usage", r.usage.completion_tokens == 3 and r.usage.total_tokens == 6, r.usage)
    check("chat id", r.id.startswith("chatcmpl-"), r.id)

    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "x"}]
    )
    check("x-request-id header", len(raw.headers.get("x-request-id", "")) == 36, raw.headers)

    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "streamed words arrive"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    check("chat streaming text", text == "streamed words arrive", text)
    check("chat streaming finish", finish == "stop", finish)
    check("chat streaming usage", usage is not None and usage.completion_tokens == 3, usage)

    # The fake worker's log-probability of its i-th word is -(i + 1) / 10.
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "with logprobs"}], logprobs=True, top_logprobs=0
    )
    lp = r.choices[0].logprobs
    check("chat logprobs tokens", lp is not None and [t.token for t in lp.content] == ["with", " logprobs"], lp)
    check("chat logprobs values", [round(t.logprob, 4) for t in lp.content] == [-0.1, -0.2], lp)
    text = ""
    for chunk in client.completions.create(model=model, prompt="a bb ccc", stream=True, logprobs=0):
        if chunk.choices and chunk.choices[0].logprobs:
            clp = chunk.choices[0].logprobs
            text += "".join(clp.tokens)
            check("completion logprobs offset", clp.text_offset[0] == len(text) - len(clp.tokens[0]), clp)
    check("completion streaming logprobs", text == "a bb ccc", text)

    c = client.completions.create(model=model, prompt="one two three four", max_tokens=2)
    check("completion non-streaming", c.choices[0].text == "one two", c)
    check("completion finish_reason", c.choices[0].finish_reason == "length", c)

    text = ""
    for chunk in client.completions.create(model=model, prompt="alpha beta", stream=True):
        if chunk.choices:
            text += chunk.choices[0].text
    check("completion streaming", text == "alpha beta", text)

    try:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
        check("unknown model raises", False, "no exception")
    except openai.NotFoundError as e:
        check("unknown model raises NotFoundError", e.status_code == 404, e)

    try:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], temperature=5)
        check("bad temperature raises", False, "no exception")
    except openai.BadRequestError as e:
        check("bad temperature raises BadRequestError", e.status_code == 400, e)

    bad = OpenAI(base_url=f"{base}/v1", api_key="tidal_wrong", max_retries=0)
    try:
        bad.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}])
        check("bad key raises", False, "no exception")
    except openai.AuthenticationError as e:
        check("bad key raises AuthenticationError", e.status_code == 401, e)

    print(f"all checks passed (openai {openai.__version__})", flush=True)


if __name__ == "__main__":
    main()
