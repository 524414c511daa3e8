"""Schemathesis hooks for tests/schemathesis.rs (loaded through SCHEMATHESIS_HOOKS).

`"wait": true` on /v1/check makes the server sleep the decision's delay_ms
(up to a policy's max_delay_ms, one hour at most) before it answers: a
generated delay policy would stall the run past its time limit. The request
is sent with `"wait": false` instead; the answer is the same decision, given
at once (tests/e2e.rs covers the sleep itself).
"""

import schemathesis


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    if (
        case.operation.path == "/v1/check"
        and isinstance(case.body, dict)
        and case.body.get("wait") is True
    ):
        case.body["wait"] = False
