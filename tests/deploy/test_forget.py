"""`arloop forget --user`: one user's data erased with the agent API's settings (issue 36)."""

from __future__ import annotations

from typer.testing import CliRunner

from agents.events import FORGET_REQUESTS, STREAM_TRAJECTORIES, decode
from deploy.cli import app
from tests.fakes.api import SECRET
from tests.fakes.scripted_llm import Reply

runner = CliRunner()


def test_forget_erases_the_users_runs_and_threads_and_no_one_elses(
    start_api, llm, redis_url, redis_client
):
    llm.responder = lambda request: Reply(content="ok")
    api = start_api()
    gone = api.run("my wristband says AB12", user="pat@example.org").json()
    api.run("hello", user="someone-else")
    env = {"ARLOOP_REDIS_URL": redis_url, "ARLOOP_SECRET_KEY": SECRET}
    done = runner.invoke(app, ["forget", "--user", "pat@example.org"], env=env)
    assert done.exit_code == 0, done.output
    assert "erased user 'pat@example.org'" in done.output and "1 threads" in done.output
    users = [decode(f).user_id for _, f in redis_client.xrange(STREAM_TRAJECTORIES)]
    assert users == [api.stored("someone-else")]
    assert redis_client.hexists(FORGET_REQUESTS, api.stored("pat@example.org"))
    thread = api.http.get(f"/v1/threads/{gone['thread_id']}", params={"user_id": "pat@example.org"})
    assert thread.status_code == 404


def test_forget_names_a_bad_id_instead_of_erasing_nothing(redis_url):
    env = {"ARLOOP_REDIS_URL": redis_url, "ARLOOP_SECRET_KEY": SECRET}
    refused = runner.invoke(app, ["forget", "--user", "pat", "--tenant", "a:b"], env=env)
    assert refused.exit_code == 2 and "--tenant 'a:b' is not a valid id" in refused.output
