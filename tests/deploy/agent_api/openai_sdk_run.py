"""A team's agent, unchanged but for its base URL: one run of OpenAI SDK calls, ended, rated."""

import os

import httpx
from openai import OpenAI

base = os.environ.get("ARLOOP_URL", "http://127.0.0.1:8000")
key = os.environ.get("ARLOOP_KEY", "dev-key")
client = OpenAI(
    base_url=f"{base}/v1",
    api_key=key,
    default_headers={"X-Arloop-Run": "job-42", "X-Arloop-Agent": "my-bot"},
)
messages = [{"role": "user", "content": "What is 17 times 23?"}]
raw = client.chat.completions.with_raw_response.create(model="arloop", messages=messages)
answer = raw.parse().choices[0].message.content  # more calls with this client: more steps
trajectory = raw.headers["X-Arloop-Trajectory"]
token = raw.headers["X-Arloop-Feedback-Token"]

auth = {"Authorization": f"Bearer {key}"}
httpx.post(f"{base}/v1/runs/{trajectory}/end", json={"output": answer}, headers=auth)
rating = {"trajectory_id": trajectory, "feedback_token": token, "kind": "thumbs", "value": 1}
httpx.post(f"{base}/v1/feedback", json=rating, headers=auth).raise_for_status()
