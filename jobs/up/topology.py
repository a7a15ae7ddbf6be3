"""Which compose services a run starts (the chosen ones and what they depend on) and which is the chief."""

from zmqflow.common.cluster import ClusterSpec
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.jobs.up.compose import ComposeError, start_order


def select(project, names, with_deps=True):
    """The chosen services (all when none named), with what they depend on unless with_deps is False."""
    unknown = [n for n in names if n not in project.services]
    if unknown:
        raise ComposeError(f"no such service: {', '.join(unknown)} (services: {', '.join(project.services)})")
    chosen, todo = set(), list(names or project.services)
    while todo:
        name = todo.pop()
        if name not in chosen:
            chosen.add(name)
            if with_deps:
                todo += list(project.services[name].depends_on)
    return [n for n in start_order(project.services) if n in chosen]


def find_chief(services):
    """The service whose TF_CONFIG makes it the chief, or None."""
    for service in services:
        raw = service.env.get("TF_CONFIG")
        if not raw:
            continue
        try:
            task = ClusterSpec.from_tf_config({"TF_CONFIG": raw})
        except InvalidArgumentError:
            continue
        if task is not None and task.task_type and task.is_chief:
            return service.name
    return None
