"""``kubectl reservation``: what the webhook decided and why, from kubectl alone.

Installed as ``kubectl-reservation`` on PATH, so kubectl finds it as a plugin:

- ``kubectl reservation report [-n NS | -A]`` prints pools (budget, reserved, available,
  overcommitted), and the applications an operator must look at;
- ``kubectl reservation explain KIND/NAME -n NS`` prints an application's charge term by term
  and the charge recorded at admission when it differs (contract drift);
- ``kubectl reservation guard [-n NS | -A]`` says whether admitted applications' pods fit their
  namespaces' ResourceQuotas.

It follows kubectl's conventions: ``--kubeconfig``, ``$KUBECONFIG`` with several files,
``--context``, ``-n``/``-A``, ``-o json|yaml|wide``, ``--request-timeout``, short names
(``vm/web1``). Against a cluster it reads only what the question needs (see
``webhook.state.one_shot``) with a timeout on every request, so a tenant's user can ask about
its own namespace and nothing ever hangs; ``--state`` reads manifest directories instead. As
``webhook`` is, it is laid out as kubectl is: one module per subcommand (``report``,
``explain``, ``guard``; ``completion`` is shared with ``webhook``), what they share about
reaching the cluster (``kubectl``), and the parser that registers them (``cli``).
"""

from webhook.commands.plugin.cli import main

__all__ = ["main"]
