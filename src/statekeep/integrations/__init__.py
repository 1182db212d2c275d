"""Adapters that put other agent frameworks' state into statekeep's stores.

* :mod:`statekeep.integrations.langgraph`: ``StatekeepSaver`` (a LangGraph checkpointer)
  and ``StatekeepStore`` (a LangGraph ``BaseStore`` over a memory store);
* :mod:`statekeep.integrations.agents`: ``StatekeepSession`` (an OpenAI Agents SDK
  session over the context event log).

Each needs its framework, installed with an extra (``pip install 'statekeep[langgraph]'``,
``pip install 'statekeep[agents]'``); the core package never imports them. Like the
runtime, an integration may compose several stores; the stores never import each other.
"""
