"""tools/suite_alone.py: reading pytest's --durations=0 lines and the suite-against-alone ratio."""

import pytest

from tools.suite_alone import Phases, Row, durations, main

LOG = """\
============================= slowest durations ==============================
40.21s call     tests/rehearsal/test_rehearsal.py::test_a_surge_rollout
20.87s setup    tests/stacks/test_aws_rules.py::test_service_registries[default]
3.10s call     tests/stacks/test_aws_rules.py::test_service_registries[default]
0.50s setup    tests/rehearsal/test_rehearsal.py::test_a_surge_rollout
1.25s teardown tests/stacks/test_updates.py::test_change[units +1 inside a cell]
2452 passed, 34 warnings in 891.54s (0:14:51)
"""


def test_each_phase_of_each_test_is_read_and_a_name_with_spaces_stays_whole():
    found = durations(LOG)
    assert found["tests/rehearsal/test_rehearsal.py::test_a_surge_rollout"] == Phases(setup=0.5, call=40.21)
    assert found["tests/stacks/test_aws_rules.py::test_service_registries[default]"] == Phases(setup=20.87, call=3.1)
    assert found["tests/stacks/test_updates.py::test_change[units +1 inside a cell]"] == Phases(teardown=1.25)
    assert len(found) == 3


def test_setup_counts_only_where_the_test_bore_a_shared_fixture_in_the_suite_too():
    bore = Row("t", suite=Phases(setup=20.0, call=4.0), alone=Phases(setup=10.0, call=2.0))
    assert bore.ratio == pytest.approx(2.0)
    # Its module's first test set the fixture up in the suite; alone, this test sets it up itself.
    shared = Row("t", suite=Phases(setup=0.2, call=3.0), alone=Phases(setup=10.0, call=2.0))
    assert shared.ratio == pytest.approx(1.5)


def test_a_log_without_durations_is_refused_naming_the_flag(tmp_path, capsys):
    log = tmp_path / "suite.log"
    log.write_text("2452 passed in 891.54s\n")
    with pytest.raises(SystemExit):
        main([str(log)])
    assert "--durations=0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(log), "--top", "0"])
    assert "--top=0 is out of range" in capsys.readouterr().err
