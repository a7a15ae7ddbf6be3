"""`zmqflow k8s render`: the Kubernetes manifests of the shipped topology for any ps/worker count."""

import os

import click

from zmqflow.common.processes.service_cli import option

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.jobs.k8s import render as k8s_render
from zmqflow.jobs.spec import DEPLOYMENT, job_spec


@click.group()
def k8s():
    """Kubernetes: render the manifests of the training and serving topology."""


@k8s.command(context_settings={"show_default": True})
@option("--num-ps", "ps", old_names=["--ps"], type=click.IntRange(min=1), default=2,
        help="ps shards: an Indexed Job of N pods ps-0.ps .. ps-{N-1}.ps, shard i on port 5600 + i.")
@option("--num-workers", "workers", old_names=["--workers"], type=click.IntRange(min=1), default=2,
        help="Workers: the chief (Job chief, pod chief-0.chief on 5610: it alone holds the admin key) "
             "and an Indexed Job of M-1 pods worker-0.worker .. (worker j on 5611 + j).")
@option("--num-serve", "serve", old_names=["--serve"], type=click.IntRange(min=1), default=DEPLOYMENT.serving.replicas,
        help="Model servers serve0 .. serve{K-1} (ports 5700 + i), all members of the aggregator.")
@click.option("--epochs", type=click.IntRange(min=1), default=DEPLOYMENT.training.epochs,
              help="Epochs the reader streams (its --num-epochs).")
@click.option("--image", default=k8s_render.DEFAULT_IMAGE,
              help="The zmqflow image (ENTRYPOINT zmqflow) every container runs: `docker build -t "
                   f"{k8s_render.DEFAULT_IMAGE} .` makes the default. NAME@sha256:DIGEST pins it (the image-digest "
                   "checks then need no skip).")
@click.option("--data", "data_spec", default=DEPLOYMENT.data, metavar="SPEC",
              help="The data spec to train on: `mnist` (the shipped sample) or a spec file inside the image (an "
                   "image built FROM zmqflow's holding the spec and its data files, with --image). Every ps, worker "
                   "and reader pod runs `zmqflow data prepare` on it in an initContainer.")
@click.option("--model", "model_spec", default=DEPLOYMENT.model, metavar="MODEL",
              help="The model fitted to the data: a built-in name, inline JSON, or a spec file or path.py:build "
                   "inside the image.")
@click.option("--model-opt", "model_opts", multiple=True, metavar="KEY=VALUE",
              help="A model option for `data prepare` (repeatable).")
@click.option("--model-name", default=DEPLOYMENT.serving.name,
              help="The name the model servers serve the model under (their --model-name).")
@click.option("--namespace", default=k8s_render.DEFAULT_NAMESPACE,
              help="The job's namespace: cluster.yaml creates it with the restricted Pod Security Standard "
                   "enforced, and every object is in it.")
@click.option("--curve/--no-curve", default=True,
              help="CURVE keys in a Secret zmqflow-curve, mounted read-only in every pod with ZMQFLOW_CURVE_DIR "
                   "set: every service encrypts and accepts only the deployment's clients, each pod holding its "
                   "role's key (the credential of member and admin ops). Fresh keys unless --curve-dir; the output "
                   "then holds private keys. --no-curve: plain TCP, admin ops need ZMQFLOW_ADMIN_TOKEN in every pod.")
@click.option("--curve-dir", default=None, type=click.Path(file_okay=False, exists=True),
              help="Put the keys of this directory (`zmqflow keys generate DIR`) in the Secret instead of fresh "
                   "ones, so clients outside the cluster can use DIR's keys (the pods mount its member, serving and "
                   "admin pairs: `zmqflow keys generate DIR --clients member,serving,admin`).")
@click.option("--tfjob", is_flag=True,
              help="Run the ps shards and workers as a Kubeflow TFJob (kubeflow.org/v1; the operator sets "
                   "TF_CONFIG) instead of the Jobs of ps.yaml and worker.yaml.")
@click.option("--trainjob", is_flag=True,
              help="Run the ps shards and workers as a Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1) "
                   "and the TrainingRuntime it references (the JobSet template) instead of the Jobs of ps.yaml and "
                   "worker.yaml.")
@click.option("--out", "out", default=None, type=click.Path(file_okay=False),
              help="Write one file per component into this directory (cluster.yaml, broker.yaml, ps.yaml, ...). "
                   "Default: one multi-document YAML on stdout.")
def render(ps, workers, serve, epochs, image, data_spec, model_spec, model_opts, model_name, namespace, curve,
           curve_dir, tfjob, trainjob, out):
    """Print the manifests: ConfigMap zmqflow-cluster (cluster.json, the TF_CONFIG entry snippet), the
    zmqflow-data claim (ReadWriteMany, checkpoints in /data), headless Services and Indexed Jobs for the ps
    shards and workers (or a TFJob with --tfjob, a TrainJob with --trainjob), Jobs for the broker and the reader
    (training runs to completion and stays done), Deployments with Services for the model servers, the aggregator
    and the gateway (serving restarts), and a Prometheus Operator ServiceMonitor for every `metrics` port. The ps, worker and reader pods prepare the data and fit the model
    in an initContainer (`zmqflow data prepare`), each into its own emptyDir at /prepared.

    \b
      zmqflow k8s render --num-ps 4 --num-workers 8 | kubectl apply -f -
      zmqflow k8s render --image my-zmqflow --data /app/pets.yaml --model cnn | kubectl apply -f -
      zmqflow k8s render --num-ps 2 --num-workers 2 --out deploy/k8s
    """
    try:
        spec = job_spec(DEPLOYMENT, ps=ps, workers=workers, replicas=serve, epochs=epochs, data=data_spec,
                        model=model_spec, model_options=model_opts, name=model_name)
        options = k8s_render.Options(spec, image=image, namespace=namespace, curve=curve, tfjob=tfjob, trainjob=trainjob)
    except InvalidArgumentError as exc:
        raise click.UsageError(str(exc)) from None
    if curve_dir and not curve:
        raise click.UsageError("--curve-dir needs CURVE: leave out --no-curve")
    try:
        files = (k8s_render.read_curve_files(curve_dir) if curve_dir else k8s_render.generate_curve_files()) \
            if curve else None
    except InvalidArgumentError as exc:
        raise click.BadParameter(str(exc), param_hint="--curve-dir") from None
    if out is None:
        click.echo(k8s_render.render_stream(options, files), nl=False)
    else:
        os.makedirs(out, exist_ok=True)
        for name, text in k8s_render.render_files(options, files, out=out).items():
            path = os.path.join(out, name)
            secret = name == "curve.yaml"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if secret else 0o644)
            if secret:
                os.fchmod(fd, 0o600)   # an older file's mode stays otherwise
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            click.echo(path, err=True)
    if curve:
        click.echo(f"note: the Secret {k8s_render.CURVE_SECRET} holds the deployment's CURVE private keys "
                   "(server.key_secret and one *.key_secret per role), base64 encoded, not encrypted: keep the output out "
                   "of version control and away from anyone who should not join the cluster.", err=True)
