"""Per-peer Prometheus series from the library's "peers" list: deltas per
peer, a bounded set of peer labels, and what happens when a peer goes."""

from peerkv._peer_metrics import OTHER_PEER, PeerSeries

PREFIX = "vllm:peerkv_"


class Sink:
    """Records what vLLM's OffloadingConnectorStats would be told."""

    def __init__(self):
        self.counters, self.gauges, self.observed = {}, {}, {}

    def increase_counter(self, name, value, labels):
        self.counters[(name, labels)] = self.counters.get((name, labels), 0) + value

    def set_gauge(self, name, value, labels):
        self.gauges[(name, labels)] = value

    def observe_histogram(self, name, value, labels):
        self.observed.setdefault((name, labels), []).append(value)


def entry(peer, **fields):
    base = {"peer": peer, "handshaked": True, "data_path": "tcp", "age_s": 1.5, "lookups_sent": 0,
            "lookup_hits": 0, "bytes_in": 0, "last_lookup_rtt_s": 0.0}
    base.update(fields)
    return base


def test_counters_are_deltas_per_peer_and_a_new_session_counts_from_zero():
    series, sink = PeerSeries(PREFIX), Sink()
    series.record(sink, [entry("10.0.0.1:5710", bytes_in=100), entry("10.0.0.2:5710", bytes_in=7)])
    series.record(sink, [entry("10.0.0.1:5710", bytes_in=150), entry("10.0.0.2:5710", bytes_in=7)])
    name = PREFIX + "peer_bytes_received"
    assert sink.counters[(name, ("10.0.0.1:5710",))] == 150
    assert sink.counters[(name, ("10.0.0.2:5710",))] == 7
    assert sink.gauges[(PREFIX + "peer_up", ("10.0.0.1:5710", "tcp"))] == 1
    # The session was replaced: the library's entry starts again from 0.
    series.record(sink, [entry("10.0.0.1:5710", bytes_in=30)])
    assert sink.counters[(name, ("10.0.0.1:5710",))] == 180


def test_a_peer_that_goes_is_down_and_its_gauges_drop():
    series, sink = PeerSeries(PREFIX), Sink()
    series.record(sink, [entry("10.0.0.1:5710", age_s=9.0, last_lookup_rtt_s=0.002)])
    assert sink.gauges[(PREFIX + "peer_session_age_seconds", ("10.0.0.1:5710",))] == 9.0
    series.record(sink, [])
    assert sink.gauges[(PREFIX + "peer_up", ("10.0.0.1:5710", "tcp"))] == 0
    assert sink.gauges[(PREFIX + "peer_session_age_seconds", ("10.0.0.1:5710",))] == 0
    assert sink.gauges[(PREFIX + "peer_last_lookup_rtt_seconds", ("10.0.0.1:5710",))] == 0


def test_peer_labels_are_bounded_and_later_peers_count_as_other():
    series, sink = PeerSeries(PREFIX, max_labels=2), Sink()
    peers = [entry(f"10.0.0.{i}:5710", lookups_sent=1) for i in range(1, 6)]
    series.record(sink, peers)
    labels = {labels for (name, labels) in sink.counters if name == PREFIX + "peer_lookups_sent"}
    assert labels == {("10.0.0.1:5710",), ("10.0.0.2:5710",), (OTHER_PEER,)}
    assert sink.counters[(PREFIX + "peer_lookups_sent", (OTHER_PEER,))] == 3
    # Peers come and go: the labels stay the first two, whoever is live.
    series.record(sink, [entry("10.0.0.9:5710", lookups_sent=4)])
    assert sink.counters[(PREFIX + "peer_lookups_sent", (OTHER_PEER,))] == 7
    assert not any(labels == (OTHER_PEER,) for (name, labels) in sink.gauges if name != PREFIX + "peer_up")


def test_a_session_still_handshaking_takes_no_label():
    series, sink = PeerSeries(PREFIX, max_labels=1), Sink()
    series.record(sink, [entry("stranger:1", handshaked=False, lookups_sent=5)])
    series.record(sink, [entry("10.0.0.1:5710", lookups_sent=1)])
    assert sink.counters == {(PREFIX + "peer_lookups_sent", ("10.0.0.1:5710",)): 1}


def test_the_lookup_rtt_histogram_is_replayed_per_peer():
    series, sink = PeerSeries(PREFIX), Sink()
    rtt = {"le": [0.001, 0.01], "counts": [2, 1, 0], "sums": [0.001, 0.004, 0.0]}
    series.record(sink, [entry("10.0.0.1:5710", lookup_rtt_s=rtt)])
    got = sink.observed[(PREFIX + "peer_lookup_rtt_seconds", ("10.0.0.1:5710",))]
    assert sorted(got) == [0.0005, 0.0005, 0.004]
    series.record(sink, [entry("10.0.0.1:5710", lookup_rtt_s=rtt)])  # nothing new
    assert len(sink.observed[(PREFIX + "peer_lookup_rtt_seconds", ("10.0.0.1:5710",))]) == 3


def link(**fields):
    base = {"rtt_p50_s": 0.001, "rtt_p99_s": 0.004, "rtt_samples": 9, "setup_s": 0.25, "pull_t0_s": 0.002,
            "pull_bytes_per_s": 4.5e9, "pull_samples": 12, "pull_age_s": 3.0, "throughput_bytes_per_s": 3e9,
            "failures": {"transfer": 0, "aborted": 0, "bad_frame": 0}}
    base.update(fields)
    return base


def test_each_peers_link_is_exported_as_gauges_and_failures_by_cause():
    series, sink = PeerSeries(PREFIX), Sink()
    a = ("10.0.0.1:5710",)
    series.record(sink, [entry("10.0.0.1:5710", link=link(failures={"transfer": 1, "aborted": 0, "bad_frame": 0}))])
    assert sink.gauges[(PREFIX + "peer_rtt_p50_seconds", a)] == 0.001
    assert sink.gauges[(PREFIX + "peer_rtt_p99_seconds", a)] == 0.004
    assert sink.gauges[(PREFIX + "peer_setup_seconds", a)] == 0.25
    assert sink.gauges[(PREFIX + "peer_pull_t0_seconds", a)] == 0.002
    assert sink.gauges[(PREFIX + "peer_pull_bytes_per_second", a)] == 4.5e9
    assert sink.gauges[(PREFIX + "peer_pull_samples", a)] == 12
    assert sink.gauges[(PREFIX + "peer_pull_age_seconds", a)] == 3.0
    assert sink.gauges[(PREFIX + "peer_throughput_bytes_per_second", (*a, "tcp"))] == 3e9
    assert sink.counters[(PREFIX + "peer_link_failures", (*a, "transfer"))] == 1
    series.record(sink, [entry("10.0.0.1:5710", link=link(failures={"transfer": 3, "aborted": 1, "bad_frame": 0}))])
    assert sink.counters[(PREFIX + "peer_link_failures", (*a, "transfer"))] == 3
    assert sink.counters[(PREFIX + "peer_link_failures", (*a, "aborted"))] == 1
    assert (PREFIX + "peer_link_failures", (*a, "bad_frame")) not in sink.counters
    # The session ends: the link's gauges drop with it, its failures stay.
    series.record(sink, [])
    assert sink.gauges[(PREFIX + "peer_pull_bytes_per_second", a)] == 0
    assert sink.gauges[(PREFIX + "peer_rtt_p99_seconds", a)] == 0
    assert sink.gauges[(PREFIX + "peer_throughput_bytes_per_second", (*a, "tcp"))] == 0
    assert sink.counters[(PREFIX + "peer_link_failures", (*a, "transfer"))] == 3


def test_a_peer_counted_as_other_has_failures_but_no_link_gauges():
    series, sink = PeerSeries(PREFIX, max_labels=1), Sink()
    failures = {"transfer": 0, "aborted": 2, "bad_frame": 0}
    series.record(sink, [entry("10.0.0.1:5710", link=link()), entry("10.0.0.2:5710", link=link(failures=failures))])
    assert sink.counters[(PREFIX + "peer_link_failures", (OTHER_PEER, "aborted"))] == 2
    assert not any(labels[0] == OTHER_PEER for (name, labels) in sink.gauges)
