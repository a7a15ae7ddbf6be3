"""`zmqflow compose`: docker-compose.yml from the job description (jobs/spec.py's DEPLOYMENT), and `docker compose`'s
up, ps, logs and down for running it as local processes (cli/up.py)."""

import click

from zmqflow.cli import up as up_commands


@click.group()
def compose():
    """docker compose's habits for the compose file: render it; up, ps, logs, down run it as local processes
    (`zmqflow up`, `zmqflow logs`, `zmqflow down` are the same commands)."""


for _command in (up_commands.command, up_commands.ps, up_commands.logs, up_commands.down):
    compose.add_command(_command)


@compose.command(context_settings={"show_default": True})
@click.option("--out", default="docker-compose.yml", type=click.Path(dir_okay=False),
              help="Write the file here ('-': standard output).")
def render(out):
    """Render the compose file of the shipped job (2 ps shards, 2 workers, a reader, 3 model servers, the
    aggregator and the gateway) from its JobSpec; `docker compose up` and `zmqflow up` run it."""
    from zmqflow.jobs.up.render import render as render_compose
    text = render_compose()
    if out == "-":
        click.echo(text, nl=False)
        return
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    click.echo(f"wrote {out}")
