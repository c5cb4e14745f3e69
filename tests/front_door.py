"""The ALB's listener rules, read from a synthesized Front template and applied to requests the way
Elastic Load Balancing applies them, in front of real routers: the front door emulated.

What is emulated, and from where:
- rules are evaluated in priority order, lowest first; the listener's default action applies when no
  rule matches ("Listener rules for your Application Load Balancer", ELB user guide);
- a path-pattern condition compares its values "only to the path of the URL, not to its query
  string"; "The comparison is case sensitive"; "* (matches 0 or more characters) and ? (matches
  exactly 1 character)"; with several values "the condition is satisfied if one of them matches"
  (ListenerRule PathPatternConfig, CloudFormation reference);
- a forward action sends the request on unchanged; fixed-response answers with its status, content
  type and body; a redirect answers 301/302 to its protocol and port.
The path is compared as the client sent it (no decoding, no dot-segment folding): whatever the ALB
does with `/v1/../metrics`, what the routers do with it is tested against them directly.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from yarl import URL

LISTENER = "AWS::ElasticLoadBalancingV2::Listener"
RULE = "AWS::ElasticLoadBalancingV2::ListenerRule"


def path_pattern(value: str) -> re.Pattern[str]:
    """An ELB path pattern as a regular expression over the whole path."""
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in value) + r"\Z")


@dataclass(frozen=True)
class Rule:
    priority: int
    patterns: tuple[re.Pattern[str], ...]  # empty: the rule has no path condition (matches every path)
    action: dict

    def matches(self, path: str) -> bool:
        return not self.patterns or any(p.match(path) for p in self.patterns)


@dataclass(frozen=True)
class Listener:
    port: int
    rules: tuple[Rule, ...]  # in priority order
    default_action: dict

    def action_for(self, raw_path: str) -> dict:
        path = raw_path.split("?", 1)[0]
        for rule in self.rules:
            if rule.matches(path):
                return rule.action
        return self.default_action


def _conditions(rule: dict) -> tuple[re.Pattern[str], ...]:
    patterns: list[re.Pattern[str]] = []
    for cond in rule["Properties"].get("Conditions", []):
        if cond["Field"] != "path-pattern":
            raise AssertionError(f"the emulation reads path-pattern conditions only, not {cond['Field']}")
        values = cond.get("PathPatternConfig", {}).get("Values") or cond.get("Values")
        patterns += [path_pattern(v) for v in values]
    return tuple(patterns)


def listener_on(template: dict, port: int) -> Listener:
    """The listener of the Front template on `port`, with its rules."""
    resources = template["Resources"]
    (logical, listener) = next(
        (k, v) for k, v in resources.items() if v["Type"] == LISTENER and v["Properties"]["Port"] == port
    )
    rules = sorted(
        (
            Rule(int(r["Properties"]["Priority"]), _conditions(r), _one(r["Properties"]["Actions"]))
            for r in resources.values()
            if r["Type"] == RULE and r["Properties"]["ListenerArn"] == {"Ref": logical}
        ),
        key=lambda r: r.priority,
    )
    return Listener(port=port, rules=tuple(rules), default_action=_one(listener["Properties"]["DefaultActions"]))


def _one(actions: list[dict]) -> dict:
    assert len(actions) == 1, f"the emulation takes one action per rule, not {actions}"
    return actions[0]


class FrontDoor:
    """An HTTP server on 127.0.0.1 that does what `listener` says with each request: a forward goes
    to `target` (a router's base URL), anything else is answered here."""

    def __init__(self, listener: Listener, target: str) -> None:
        self.listener, self.target = listener, target
        self.forwarded: list[str] = []  # raw paths that reached the target
        self.port: int | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        action = self.listener.action_for(request.raw_path)
        if action["Type"] == "fixed-response":
            config = action["FixedResponseConfig"]
            return web.Response(
                status=int(config["StatusCode"]),
                text=config.get("MessageBody", ""),
                content_type=config.get("ContentType", "text/plain"),
            )
        if action["Type"] == "redirect":
            config = action["RedirectConfig"]
            status = 301 if config["StatusCode"] == "HTTP_301" else 302
            location = f"{config['Protocol'].lower()}://{request.host.split(':')[0]}:{config['Port']}{request.raw_path}"
            return web.Response(status=status, headers={"Location": location})
        assert action["Type"] == "forward", action
        self.forwarded.append(request.raw_path)
        assert self._session is not None
        async with self._session.request(
            request.method,
            URL(self.target + request.raw_path, encoded=True),  # as received: no dot-segment folding
            headers={k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")},
            data=await request.read(),
            allow_redirects=False,
        ) as upstream:
            return web.Response(status=upstream.status, body=await upstream.read(), content_type=upstream.content_type)

    async def __aenter__(self) -> FrontDoor:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        return self

    async def __aexit__(self, *exc) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
