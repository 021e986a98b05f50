"""`specserve loadtest` end to end against the fake server: flags, and every report section."""

import json


def test_cli_loadtest_flags_default_off():
    from specserve.cli import build_parser

    args = build_parser().parse_args(["loadtest"])
    assert (args.plot, args.overload_factor, args.disconnect) == (None, 0.0, 0)
    assert (args.overload_seconds, args.overload_capacity, args.disconnect_after) == (20.0, None, 3)
    assert args.overload_processes == 4
    args = build_parser().parse_args(
        ["loadtest", "--plot", "x.png", "--overload-factor", "1.5", "--disconnect", "8"]
    )
    assert (str(args.plot), args.overload_factor, args.disconnect) == ("x.png", 1.5, 8)


def test_cli_loadtest_writes_overload_disconnect_and_plot(tmp_path, fake_server):
    from specserve.cli import main

    data, out, png = tmp_path / "p.jsonl", tmp_path / "load.json", tmp_path / "load.png"
    data.write_text(json.dumps({"turns": ["hi"]}) + "\n")
    flags = "--variants 1 --concurrency 1,2 --requests 2 --modes policy --max-tokens 3"
    flags += " --overload-factor 1 --overload-seconds 0.3 --disconnect 2 --disconnect-after 2"
    with fake_server() as srv:
        argv = ["loadtest", "--url", srv.url, "--token", "t", *flags.split()]
        assert main([*argv, "--data", str(data), "--out", str(out), "--plot", str(png)]) == 0
        puts = srv.strategy_puts
    report = json.loads(out.read_text())
    assert set(report["results"]["policy"]) == {"1", "2"} and puts == 2  # forced, then reset
    assert report["engine"]["policy"] == {"1": None, "2": None}  # the fake server has none
    assert report["overload"]["clients"] == 2 and report["overload"]["completed"] > 0
    assert report["overload"]["failed"] == 0 and report["overload"]["refused"] == 0
    assert report["disconnect"]["streams"] == 2 and report["disconnect"]["cut"] == 2
    assert report["plot"] == str(png) and png.stat().st_size < 100_000
