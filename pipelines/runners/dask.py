"""evalbeam's Dask runner: Beam's DaskRunner with the graph translation redone where Beam's
loses data (`--runner DaskRunner` names this class; deploy/README.md, "Dask").

Beam's DaskRunner (apache-beam 2.77) turns a pipeline into dask bags. Three of its choices lose
data in any pipeline shaped like evalbeam's, each reproduced in deploy/dask/ for Beam's tracker:

1. one bag per *transform*, and the tags of a multi-output ParDo dropped: every consumer of one
   output receives the elements of all of them (repro_tagged_outputs.py);
2. only the bag of the last transform visited is computed: the other sinks never run
   (repro_unrun_sinks.py);
3. what a DoFn emits in `finish_bundle` is dropped (repro_finish_bundle.py).

This module keeps Beam's DoFn invocation machinery and replaces the translation: one bag per
*PCollection* holding WindowedValues; a multi-output ParDo computes one bag of (tag, value)
pairs that each output filters (dask computes it once, since all sinks are computed together);
a partition is one bundle, finish_bundle's outputs included; side inputs are delayed lists
the reading tasks depend on, not bags computed from inside a running task (which blocks a
worker thread); GroupByKey groups on the pickled key, as Beam groups on the encoded key, so keys
Python cannot hash group too; every PCollection that nothing consumes is
computed, reduced to its element count so no data travels to the client.
The other runners do not see any of this: it is chosen only by `--runner DaskRunner`.

Before a run, check_scheduler makes sure that --dask_client_address names a Dask scheduler that
answers, within a few seconds (dask.distributed's own client waits 30 s for an address where
nothing listens, and reads an HTTP server's answer as the length of a message of exabytes).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import math
import pickle
import socket
import time

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.pipeline import PipelineVisitor
from apache_beam.runners.common import (DoFnContext, DoFnInvoker, DoFnSignature, Receiver,
                                        _OutputHandler)
from apache_beam.runners.dask import dask_runner as beam_dask
from apache_beam.runners.dask.overrides import (_Create, _Flatten, _GroupByKeyOnly,
                                                dask_overrides)
from apache_beam.transforms.sideinputs import SideInputMap
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

MAIN = None  # the tag of a ParDo's main output in the (tag, value) pairs below
PARTITION_SIZE = 128  # elements per partition of a Create, Beam's DaskRunner's default floor
# seconds check_scheduler waits in all for the scheduler of --dask_client_address to answer,
# unless --dask_connection_timeout says otherwise (a scheduler answers in milliseconds)
SCHEDULER_CHECK_SECONDS = 5.0


def _global(value) -> WindowedValue:
    return WindowedValue(value, MIN_TIMESTAMP, (GlobalWindow(),))


class _ListReceiver(Receiver):
    """Collects one output's WindowedValues as (tag, value) pairs into a shared list."""

    def __init__(self, tag, into: list):
        self.tag, self.into = tag, into

    def receive(self, windowed_value):
        self.into.append((self.tag, windowed_value))


class _Receivers(dict):
    def __init__(self, into: list):
        super().__init__()
        self.into = into

    def __missing__(self, tag):
        self[tag] = receiver = _ListReceiver(tag, self.into)
        return receiver


def _run_dofn(items, transform, window_fn, label, side_specs, *side_values):
    """One dask partition as one Beam bundle: setup, start_bundle, process each WindowedValue,
    finish_bundle (whose outputs are kept), teardown. Returns (tag, WindowedValue) pairs."""
    out: list = []
    receivers = _Receivers(out)
    side_inputs = [SideInputMap(view_class, view_options, values)
                   for (view_class, view_options), values in zip(side_specs, side_values)]
    args, kwargs = transform.raw_side_inputs
    invoker = DoFnInvoker.create_invoker(
        DoFnSignature(transform.fn),
        _OutputHandler(window_fn=window_fn, main_receivers=receivers[MAIN],
                       tagged_receivers=receivers, per_element_output_counter=None,
                       output_batch_converter=None, process_yields_batches=False,
                       process_batch_yields_elements=False),
        context=DoFnContext(label, state=None), side_inputs=side_inputs,
        input_args=list(args), input_kwargs=kwargs, user_state_context=None,
        bundle_finalizer_param=beam.DoFn.BundleFinalizerParam())
    invoker.invoke_setup()
    invoker.invoke_start_bundle()
    for item in items:
        invoker.invoke_process(item)
    invoker.invoke_finish_bundle()
    invoker.invoke_teardown()
    return out


def _has_tag(tag, pair) -> bool:
    return pair[0] == tag


def _value(pair):
    return pair[1]


def _encoded_key(windowed) -> bytes:
    """The key of a WindowedValue((key, reified value)) as Beam groups it, by its encoding (a
    pickle here): keys Python cannot hash group too."""
    return pickle.dumps(windowed.value[0], protocol=4)


def _group_partition(pairs):
    """(encoded key, [WindowedValue((key, reified value)), ...]) pairs to WindowedValues of
    (key, [reified values])."""
    return [_global((members[0].value[0], [windowed.value[1] for windowed in members]))
            for _, members in pairs]


def _concat(partitions) -> list:
    return list(itertools.chain.from_iterable(partitions))


def _count(partition) -> list:
    return [sum(1 for _ in partition)]


class _BagVisitor(PipelineVisitor):
    """Translates each leaf transform into dask bags, one per output PCollection."""

    def __init__(self, bag_kwargs: dict):
        self.bag_kwargs = bag_kwargs
        self.bags: dict = {}  # PCollection -> dask bag of WindowedValues
        self.consumed: set = set()

    def visit_transform(self, node) -> None:
        import dask.bag as db

        transform = node.transform
        inputs = [value for value in node.inputs if not isinstance(value, pvalue.PBegin)]
        self.consumed.update(inputs)
        self.consumed.update(side.pvalue for side in node.side_inputs)
        in_bags = [self.bags[value] for value in inputs]
        if isinstance(transform, _Create):
            values = list(transform.values)
            options = dict(self.bag_kwargs) or {
                "partition_size": max(PARTITION_SIZE, math.ceil(math.sqrt(len(values)) / 10))}
            self._publish(node, db.from_sequence([_global(v) for v in values], **options)
                          if values else db.from_sequence([], npartitions=1))
        elif isinstance(transform, beam.ParDo):
            self._publish_pardo(node, in_bags[0])
        elif isinstance(transform, _GroupByKeyOnly):
            grouped = in_bags[0].groupby(_encoded_key, shuffle="tasks")
            self._publish(node, grouped.map_partitions(_group_partition))
        elif isinstance(transform, _Flatten):
            self._publish(node, db.concat(in_bags) if in_bags
                          else db.from_sequence([], npartitions=1))
        elif in_bags:  # Reshuffle and the like: the identity here
            self._publish(node, in_bags[0])
        elif node.outputs:
            raise NotImplementedError(f"evalbeam's Dask runner cannot translate "
                                      f"{type(transform).__name__} ({node.full_label})")

    def _publish(self, node, bag) -> None:
        for output in node.outputs.values():
            self.bags[output] = bag

    def _publish_pardo(self, node, bag) -> None:
        import dask

        transform = node.transform
        main_input = next(iter(node.main_inputs.values()))
        window_fn = main_input.windowing.windowfn if hasattr(main_input, "windowing") else None
        side_specs, side_values = [], []
        for side in node.side_inputs:
            side_specs.append((type(side), side._view_options()))
            # the side input's partitions, unoptimized (an optimized copy of their graph would
            # have keys of its own and run the producers, side effects included, once more)
            parts = self.bags[side.pvalue].to_delayed(optimize_graph=False)
            side_values.append(dask.delayed(_concat)(parts))
        # tasks named after the Beam step, so that dask's dashboard and its errors (a
        # KilledWorker names the task) point at the step
        pairs = bag.map_partitions(_run_dofn, transform, window_fn, node.full_label,
                                   side_specs, *side_values, token=_task_name(node.full_label))
        main_tag = _main_tag(node)
        for tag, output in node.outputs.items():
            wanted = MAIN if tag == main_tag else tag
            self.bags[output] = pairs.filter(lambda pair, t=wanted: _has_tag(t, pair)).map(_value)

    def sinks(self) -> list:
        """Every PCollection that no transform reads: computing them computes the pipeline."""
        return [bag for pcoll, bag in self.bags.items() if pcoll not in self.consumed]


def _task_name(label: str) -> str:
    return "beam:" + "".join(c if c.isalnum() or c in "/()[]_.-" else "_" for c in label)


def _main_tag(node):
    """The key of node.outputs that holds the ParDo's main output."""
    tags = list(node.outputs)
    declared = set(getattr(node.transform, "output_tags", ()) or ())
    for tag in tags:
        if tag is None or tag not in declared:
            return tag
    return tags[0]


class DaskRunner(beam_dask.DaskRunner):
    """Beam's DaskRunner with evalbeam's translation (see the module docstring)."""

    def run_pipeline(self, pipeline, options):
        import dask.distributed as ddist

        dask_options = options.view_as(beam_dask.DaskOptions).get_all_options(
            drop_default=True, current_only=True)
        bag_kwargs = beam_dask.DaskOptions._extract_bag_kwargs(dask_options)
        client = ddist.Client(**dask_options)
        pipeline.replace_all(dask_overrides())
        visitor = _BagVisitor(bag_kwargs)
        pipeline.visit(visitor)
        counts = [bag.map_partitions(_count) for bag in visitor.sinks()]
        # no graph optimization: dask's bag optimizations fuse a task into its dependents and
        # make partitions lazy iterators, so a bag read by two consumers (a ParDo's outputs, a
        # PCollection metered and grouped) was computed once per consumer, or exhausted by the
        # first; unfused, each PCollection's partition is computed once and shared
        futures = client.compute(counts, optimize_graph=False)
        return DaskRunnerResult(client, futures)


class DaskRunnerResult(beam_dask.DaskRunnerResult):
    """Beam's result, which also closes the client it was given once the job has ended (Beam's
    leaves it open, and it then logs reconnection errors after the cluster goes away)."""

    def wait_until_finish(self, duration=None) -> str:
        try:
            return super().wait_until_finish(duration)
        finally:
            if self._state != beam_dask.PipelineState.RUNNING:
                self.client.close()


def check_scheduler_option(beam_args: list[str]) -> None:
    """check_scheduler on the --dask_client_address of these Beam options, if there is one, with
    --dask_connection_timeout (whole seconds, more than 0) as its timeout when given, else
    SCHEDULER_CHECK_SECONDS. Without an address dask starts a local cluster: nothing to check.
    Raises UsageError."""
    from apache_beam.options.pipeline_options import PipelineOptions

    options = PipelineOptions(list(beam_args)).view_as(beam_dask.DaskOptions)
    if not options.address:
        return
    timeout = options.timeout      # an int, or dask's no_default when absent or not a number
    check_scheduler(options.address, timeout if isinstance(timeout, int) and timeout > 0
                    else SCHEDULER_CHECK_SECONDS)


def check_scheduler(address: str, timeout: float = SCHEDULER_CHECK_SECONDS) -> None:
    """Raise UsageError (one paragraph: the address, what happened, what to do) unless a Dask
    scheduler answers at `address` within `timeout` seconds in all. Nothing is written.

    Two steps, under one deadline: a plain TCP connection (refused: nothing listens, at once;
    no answer: the timeout; a host name that does not resolve), then dask's own connection and
    handshake and an `identity` request, whose reply must say "Scheduler" (a worker's says
    "Worker"). Anything the second step raises means the peer does not speak Dask's protocol:
    an HTTP server's "HTTP/1.1 ..." read as a Dask message's length makes dask allocate
    exabytes (MemoryError); garbage, or a peer that closes, fails the read; a peer that never
    answers times out. Addresses of schemes other than tcp:// (tls://, ws://, ...) are left to
    dask: they need security settings Beam's Dask options cannot give."""
    from distributed.comm import registry
    from distributed.comm.addressing import parse_address, parse_host_port

    from evalbeam.pipelines.launch.common import UsageError

    def refuse(what: str, todo: str = "") -> UsageError:
        return UsageError(f"--dask_client_address {address}: {what}. "
                          f"{todo or _START_SCHEDULER} Nothing was written.")

    waited = (f"within {timeout:g} s (the check's timeout; --dask_connection_timeout SECONDS "
              f"sets it)")
    try:
        scheme, location = parse_address(address)
        host, port = parse_host_port(location)
    except ValueError as error:
        raise refuse(f"not a Dask scheduler's address ({error})",
                     "Give it as tcp://HOST:PORT, the address `dask scheduler` prints "
                     "(port 8786 by default).") from None
    if scheme not in registry.backends:
        raise refuse(f"{scheme}:// is not a Dask protocol",
                     "Give the scheduler's address as tcp://HOST:PORT (port 8786 by default); "
                     "http://HOST:8787 is its dashboard, not the scheduler.")
    if scheme != "tcp":
        return
    if not 0 < port < 65536:
        raise refuse(f"port {port} is not a TCP port (1 to 65535)",
                     "Give it as tcp://HOST:PORT, the address `dask scheduler` prints.")
    deadline = time.monotonic() + timeout
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except socket.gaierror as error:
        raise refuse(f"the host name {host!r} is not known ({error.strerror})") from None
    except ConnectionRefusedError:
        raise refuse(f"nothing listens on port {port} of {host} (the connection was "
                     f"refused)") from None
    except TimeoutError:
        raise refuse(f"{host} did not accept a connection on port {port} {waited}: a wrong "
                     f"host, or a firewall that drops the packets") from None
    except OSError as error:
        raise refuse(f"{host} port {port} cannot be reached ({error.strerror or error})") from None
    try:
        # in a thread of its own: asyncio.run cannot run inside a running event loop (a notebook)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            reply = pool.submit(asyncio.run, _identity(address, deadline)).result()
    except TimeoutError:
        raise refuse(f"something on port {port} of {host} accepted the connection but gave no "
                     f"Dask answer {waited}: it is not a Dask scheduler, or a scheduler too "
                     f"busy to answer") from None
    except Exception:   # MemoryError included: see the docstring
        raise refuse(f"something listens on port {port} of {host}, but it does not speak "
                     f"Dask's protocol, so it is not a Dask scheduler (an HTTP server, such as "
                     f"the scheduler's dashboard, or another service)") from None
    kind = reply.get("type") if isinstance(reply, dict) else None
    if kind == "Worker":
        raise refuse("that is a Dask worker, not the scheduler",
                     "Give the scheduler's address, the one the workers were started with.")
    if kind != "Scheduler":
        raise refuse(f"a Dask server answers there, but it is not a scheduler (it says "
                     f"{str(kind)[:40]!r})")


_START_SCHEDULER = ("Start the scheduler first (`dask scheduler` prints its address, port 8786 "
                    "by default), or correct the address, which is tcp://HOST:PORT.")


async def _identity(address: str, deadline: float):
    """What the Dask server at address says it is (its reply to `identity`), by the deadline
    (time.monotonic()); raises TimeoutError after it."""
    from distributed.comm import connect

    remaining = max(0.001, deadline - time.monotonic())

    async def ask():
        # dask's own timeout later than the deadline's, so that wait_for is the one that fires
        comm = await connect(address, timeout=remaining + 1)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    return await asyncio.wait_for(ask(), remaining)
