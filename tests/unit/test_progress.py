"""Progress output: plain lines off a terminal, a rich bar with the same lines on one."""

from horizonrl.cluster.train.metrics import ProgressReporter

M = {"step": 1, "horizon": 3, "policy_version": 2, "reward_mean": 0.5, "success_rate": 0.5,
     "turns_mean": 2.0, "invalid_action_rate": 0.1, "tokens_per_s": 100.0,
     "env_steps_per_s": 50.0, "seconds": {"generate": 1.0, "env": 0.1, "transport": 0.01,
                                         "learn": 0.5, "weight_sync": 0.02, "iteration": 1.7}}


def test_plain_lines_when_not_a_terminal(capsys):
    p = ProgressReporter(total=4, done=1, interactive=False)
    p.update(M)
    p.close()
    out = capsys.readouterr().out
    assert out.startswith("step   2/4 | H 3 | v2 | reward 0.500 | success 0.500")


def test_rich_bar_keeps_the_lines(capsys):
    p = ProgressReporter(total=4, done=1, interactive=True)
    p.update(M)
    p.close()
    assert "step   2/4 | H 3" in capsys.readouterr().out
