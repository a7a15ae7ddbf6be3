"""`zmqflow demo`: what `make demo` runs (zmqflow.jobs.demo)."""

import click

from zmqflow.common.processes.service_cli import option


@click.command()
@click.option("--queue-tour/--no-queue-tour", default=True, show_default=True,
              help="Start with a short tour of the queue-broker (MNIST through a shuffle queue).")
@click.option("--epochs", default=10, show_default=True, type=click.IntRange(1), help="Epochs of the main training.")
@click.option("--sweep-epochs", default=3, show_default=True, type=click.IntRange(1), help="Epochs of each sweep run.")
@option("--load-secs", "load_seconds", old_names=["--load-seconds"],
        default=4.0, show_default=True, type=click.FloatRange(min=0.5),
        help="Length of the load test (a member is killed half-way).")
@click.option("--work-dir", type=click.Path(file_okay=False), default=None,
              help="Where checkpoints, the sweep and logs go (default: a new temporary directory).")
def demo(queue_tour, epochs, sweep_epochs, load_seconds, work_dir):
    """Run the demo (what `make demo` runs): train with 2 ps + 2 workers, sweep, serve the best
    three as an ensemble, load-test it with a member killed half-way, and summarize."""
    from zmqflow.jobs.demo.tour import run_demo
    from zmqflow.jobs.demo.story import run_story
    if queue_tour:
        run_demo()
    run_story(work_dir=work_dir, epochs=epochs, sweep_epochs=sweep_epochs, load_seconds=load_seconds)
