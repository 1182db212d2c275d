"""HTTP access for people: the approval webhook (needs the ``statekeep[web]`` extra).

>>> from statekeep.workflow import SQLWorkflowStore
>>> from statekeep.web import create_app
>>> app = create_app(SQLWorkflowStore("sqlite://"), tokens={"alice@example.com": "a-long-random-token"})
>>> sorted(path for path in app.openapi()["paths"] if path.startswith("/approvals"))
['/approvals', '/approvals/{approval_id}', '/approvals/{approval_id}/decision']
"""

from statekeep.web.app import DEFAULT_MAX_BODY, ApprovalOut, Decision, Grant, RunOut, create_app

__all__ = ["DEFAULT_MAX_BODY", "ApprovalOut", "Decision", "Grant", "RunOut", "create_app"]
