"""Which compose services a run starts (the chosen ones and what they depend on) and which is the chief."""

from zmqflow.common.cluster.spec import ClusterSpec
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.jobs.up.compose import ComposeError, start_order


def select(project, names, with_deps=True, profiles=()):
    """The chosen services (when none are named: those of no profile or an enabled one), with what
    they depend on unless with_deps is False."""
    unknown = [n for n in names if n not in project.services]
    if unknown:
        raise ComposeError(f"no such service: {', '.join(unknown)} (services: {', '.join(project.services)})")
    chosen, todo = set(), list(names or project.active(profiles))
    while todo:
        name = todo.pop()
        if name not in chosen:
            chosen.add(name)
            if with_deps:
                todo += list(project.services[name].depends_on)
    return [n for n in start_order(project.services) if n in chosen]


def check_local_ports(project, chosen):
    """On one host every service needs ports of its own: two chosen services that expose the same
    port would clash under `zmqflow up` (containers have an address each, processes do not)."""
    owner = {}
    for name in chosen:
        for port in project.services[name].expose:
            if port in owner:
                raise ComposeError(f"service {name} expose: port {port} is also exposed by service {owner[port]}; "
                                   "zmqflow up runs every service on this host, so each needs its own port")
            owner[port] = name


def waits_for_completion(services, name):
    """Whether another of `services` starts only once `name` completed successfully."""
    return any(s.depends_on.get(name) == "service_completed_successfully" for s in services)


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
