"""HTTP access for people: the web console and its API (needs the ``statekeep[web]`` extra).

>>> from statekeep.workflow import SQLWorkflowStore
>>> from statekeep.web import create_app
>>> app = create_app(SQLWorkflowStore("sqlite://"), tokens={"alice@example.com": "a-long-random-token"})
>>> sorted(path for path in app.openapi()["paths"] if path.startswith("/api/approvals"))
['/api/approvals', '/api/approvals/{approval_id}', '/api/approvals/{approval_id}/decision']
"""

from statekeep._extras import requires

with requires("web", "the web console"):
    from statekeep.web.access import DEFAULT_MAX_BODY, Grant
    from statekeep.web.api import ApprovalOut, Decision, RunOut
    from statekeep.web.app import check_config, create_app
    from statekeep.web.stores import Stores

__all__ = [
    "DEFAULT_MAX_BODY",
    "ApprovalOut",
    "Decision",
    "Grant",
    "RunOut",
    "Stores",
    "check_config",
    "create_app",
]
