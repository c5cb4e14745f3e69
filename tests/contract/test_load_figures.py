"""A member's load figures are declared once (contract.ready.Load): what a router reads of them
(LoadReport, load_figures) names only figures a member writes, with the same kind of value, and
a load a member writes reads back figure for figure."""

from __future__ import annotations

from contract.ready import Load, LoadReport, load_figures


def _kind(annotation: object) -> type:
    return next(k for k in (int, float) if k.__name__ in str(annotation))


def test_every_figure_a_router_reads_is_one_a_member_writes_with_the_same_kind():
    written = Load.model_fields
    for name, info in LoadReport.model_fields.items():
        assert name in written, f"LoadReport.{name} is not a figure contract.ready.Load declares"
        assert _kind(info.annotation) is _kind(written[name].annotation), name


def test_a_written_load_reads_back_figure_for_figure():
    sent = Load(
        queue_depth=1,
        running=2,
        max_running=8,
        kv_cache_used=0.5,
        in_flight=3,
        prefill_tokens=40,
        wait_s=0.2,
        queue_timeout_s=30.0,
        step_s=0.05,
        tokens_per_step=1.5,
    ).to_dict()
    figures = dict(zip(LoadReport.model_fields, load_figures(sent)))
    assert figures == {name: sent[name] for name in LoadReport.model_fields}
    assert LoadReport.model_validate(sent).figures() == load_figures(sent)


def test_a_figure_an_older_member_leaves_out_reads_as_not_said():
    assert load_figures({"running": 1})[0] == -1 and LoadReport.model_validate({}).in_flight == -1
    assert Load().in_flight == 0  # a member writes 0 where it has none (a follower)
