"""`zmqflow aggregator` / `zmqflow-aggregator`: run one aggregator over model servers."""

import click

from zmqflow.common.processes.service_cli import option, run_service_instance, service_main, service_options
from zmqflow.common.wire.protocol import AGGREGATOR_MODES


def parse_member(text):
    """`ADDRESS[=WEIGHT]` -> (address, weight); weight defaults to 1."""
    address, sep, weight = text.rpartition("=") if "=" in text else (text, "", "")
    if not sep:
        return text, 1.0
    try:
        value = float(weight)
    except ValueError:
        raise click.BadParameter(f"member {text!r}: weight {weight!r} is not a number") from None
    if not address or value < 0:
        raise click.BadParameter(f"member {text!r}: expected ADDRESS[=WEIGHT] with WEIGHT >= 0")
    return address, value


@click.command(name="aggregator", context_settings={"show_default": True})
@service_options(default_bind="127.0.0.1:5800")
@click.option("--member", "members", multiple=True, metavar="ADDRESS[=WEIGHT]",
              help="A model server to ask (repeat); WEIGHT counts in --combine weighted.")
@click.option("--mode", default="ensemble", type=click.Choice(AGGREGATOR_MODES),
              help="ensemble: ask every healthy member and combine; replica: ask the least busy one.")
@click.option("--deadline-ms", default=1000, type=click.IntRange(min=1),
              help="Deadline of a predict request that names none.")
@click.option("--min-members", default=1, type=click.IntRange(min=1),
              help="Answers a request needs by its deadline (ensemble), unless it names its own.")
@click.option("--combine", default="mean", metavar="mean|vote|weighted|median|FILE.py:FUNCTION",
              help="How answers are combined, unless a request names its own: mean (probabilities, or values of a "
                   "regression), majority vote, weighted mean, median, or a function of yours "
                   "`function(answers, weights) -> [n, outputs]` (FILE.py:FUNCTION or MODULE:FUNCTION).")
@click.option("--unhealthy-after", default=3, type=click.IntRange(min=1),
              help="Failures in a row (timeouts, errors) that mark a member unhealthy.")
@click.option("--min-healthy", default=None, type=click.IntRange(min=0), show_default="max(1, --min-members)",
              help="Timeouts never mark a member unhealthy when that would leave fewer healthy members than this: "
                   "under overload members are busy, not broken. Errors and dropped connections still do.")
@click.option("--admit-share", default=0.5, type=click.FloatRange(0, 1),
              help="Send a request to a member only if, by its pace and the requests it holds, it should answer "
                   "within this share of the request's time left; busier members are skipped, and a request left "
                   "with too few is shed at once with RESOURCE_EXHAUSTED and a retry hint (retry_after_ms), as is "
                   "one that waited past its deadline in the aggregator's own queue. 0: never shed.")
@option("--probe-every-secs", "probe_every_secs", old_names=["--probe-ms"], old_scale={"--probe-ms": 0.001},
        default=0.5, type=click.FloatRange(min=0.001),
        help="How often an unhealthy member is probed; it is taken back when it answers.")
def command(members, mode, deadline_ms, min_members, combine, unhealthy_after, min_healthy, admit_share, probe_every_secs,
            **service):
    """Answer predict requests from several model servers by each request's deadline."""
    from zmqflow.services.aggregator.server import Aggregator

    parsed = [parse_member(m) for item in members for m in item.split(",") if m]
    run_service_instance("aggregator", Aggregator, parsed, mode=mode, deadline_ms=deadline_ms, min_members=min_members,
                         combine=combine, unhealthy_after=unhealthy_after, probe_ms=probe_every_secs * 1000, min_healthy=min_healthy,
                         admit_share=admit_share, **service)


def main():
    service_main(command)


if __name__ == "__main__":
    main()
