"""Drives a Flotilla server through its Fleet Manager (ARM) paths with the real Azure SDK for Python.

    python test_sdk.py BASE_URL CA_PEM TOKEN_FILE

BASE_URL is the server (https://127.0.0.1:PORT), CA_PEM the CA that signed its certificate (given
to the SDK as its CA setting, `connection_verify`), TOKEN_FILE holds a Flotilla admin token whose
subject is `azure-sdk-test`. scripts/azure-sdk.sh starts the server with
tests/azure-sdk/driver.json as its default driver (simulated clusters c1..c5 in eastus at 1.30.5;
1.31.2 in the catalog) and runs this. The client has the SDK's default policies; every long-running
operation goes through the SDK's own poller. Exits 1 at the first failure.
"""

import logging
import os
import sys
import time
import urllib.parse

from azure.core.credentials import AccessToken, AccessTokenInfo
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.mgmt.containerservicefleet import ContainerServiceFleetMgmtClient
from azure.mgmt.containerservicefleet import models as m

SUB = "11111111-2222-3333-4444-555555555555"  # also in driver.json's cluster ids
RG = "flotilla-sdk"
FLEET = "sdk-fleet"
SUBJECT = "azure-sdk-test"
VERSION = "1.31.2"
PROVIDER = "/providers/Microsoft.ContainerService"
FLEET_ID = f"/subscriptions/{SUB}/resourceGroups/{RG}{PROVIDER}/fleets/{FLEET}"
MEMBERS = {"m1": "canary", "m2": "canary", "m3": "prod", "m4": "prod", "m5": "prod"}
# A long-running operation the server answers at once must not take longer than this: the SDK's
# default polling interval is 30 s, so a slow one means the answer made the SDK poll.
LRO_LIMIT = 10.0


class Failure(Exception):
    pass


def cluster_id(member):
    return f"/subscriptions/{SUB}/resourceGroups/clusters{PROVIDER}/managedClusters/c{member[1:]}"


class FlotillaCredential:
    """Hands the SDK a Flotilla token, as a TokenCredential and as a SupportsTokenInfo."""

    def __init__(self, token):
        self.token = token
        self.calls = 0

    def get_token(self, *scopes, **kwargs):
        self.calls += 1
        return AccessToken(self.token, int(time.time()) + 3600)

    def get_token_info(self, *scopes, options=None):
        self.calls += 1
        return AccessTokenInfo(self.token, int(time.time()) + 3600)


def check(cond, what):
    if not cond:
        raise Failure(what)


def same_id(got, want, what):
    check(got is not None and got.lower() == want.lower(), f"{what}: id {got!r}, expected {want!r}")


def arm_id(got, what):
    check(isinstance(got, str) and got.startswith("/subscriptions/"), f"{what}: {got!r} is not an ARM id")


def step(text):
    print(f"--- {text}", flush=True)


def ok(text):
    print(f"    ok: {text}", flush=True)


def lro(what, poller):
    """The result of an SDK poller, which must come quickly."""
    started = time.monotonic()
    result = poller.result()
    took = time.monotonic() - started
    check(poller.status().lower() == "succeeded", f"{what}: poller status {poller.status()!r}")
    check(
        took < LRO_LIMIT,
        f"{what}: the SDK's poller took {took:.1f} s (the server's answer made it poll; "
        "expected a provisioningState of Succeeded in the body or a short Retry-After)",
    )
    return result


def text(value):
    """An enum's string (the SDK's enums print as `UpdateState.RUNNING`)."""
    return getattr(value, "value", value)


def run_state(run):
    return text(run.properties.status.status.state)


def member_states(run):
    out = {}
    for stage in run.properties.status.stages or []:
        for group in stage.groups or []:
            for member in group.members or []:
                out[member.name] = text(member.status.state)
    return out


def stage_status(run, name):
    for stage in run.properties.status.stages or []:
        if stage.name == name:
            return stage
    raise Failure(f"run {run.name}: no stage {name!r} in its status")


def wait_for(what, fetch, done, timeout, interval=0.25):
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise Failure(f"{what}: not reached in {timeout} s")
        time.sleep(interval)


def pages(what, paged, base):
    """Every page of a list, with the nextLinks the SDK followed."""
    pager = paged.by_page()
    out, links = [], []
    for page in pager:
        out.append([item.name for item in page])
        link = pager.continuation_token
        if link:
            links.append(link)
    for link in links:
        check(
            link.lower().startswith(base.lower() + "/subscriptions/"),
            f"{what}: nextLink {link!r} is not absolute under {base}/subscriptions/",
        )
    return out, links


def main():
    base, ca, token_file = sys.argv[1:4]
    with open(token_file) as f:
        token = f.read().strip()
    log = os.environ.get("FLOTILLA_AZURE_SDK_LOG")
    if log:
        # The SDK's own HTTP logging policy: methods, URLs, status codes and headers.
        handler = logging.FileHandler(log)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        http_log = logging.getLogger("azure.core.pipeline.policies.http_logging_policy")
        http_log.setLevel(logging.INFO)
        http_log.addHandler(handler)

    credential = FlotillaCredential(token)
    client = ContainerServiceFleetMgmtClient(credential, SUB, base_url=base, connection_verify=ca)
    fleets, members, strategies = client.fleets, client.fleet_members, client.fleet_update_strategies
    runs, gates, profiles = client.update_runs, client.gates, client.auto_upgrade_profiles

    step(f"create fleet {FLEET} in subscription {SUB}, resource group {RG}")
    fleet = lro("fleets.begin_create_or_update", fleets.begin_create_or_update(
        RG, FLEET, m.Fleet(location="eastus", tags={"purpose": "sdk-test"})))
    same_id(fleet.id, FLEET_ID, "fleet")
    check(fleet.name == FLEET, f"fleet name {fleet.name!r}")
    check((fleet.type or "").lower() == "microsoft.containerservice/fleets", f"fleet type {fleet.type!r}")
    check(fleet.location == "eastus", f"fleet location {fleet.location!r}")
    check(fleet.tags == {"purpose": "sdk-test"}, f"fleet tags {fleet.tags!r}")
    check(fleet.system_data is not None and fleet.system_data.created_by == SUBJECT,
          f"fleet systemData {fleet.system_data!r}, expected createdBy {SUBJECT}")
    check(credential.calls >= 1, "the SDK never asked the credential for a token")
    ok(f"{fleet.id}, provisioningState {text(fleet.properties.provisioning_state)}")
    got = fleets.get(RG, FLEET)
    same_id(got.id, FLEET_ID, "fleets.get")
    got = fleets.get(RG.upper(), FLEET.upper())
    check(got.name == FLEET, f"fleets.get with the names in upper case: {got.name!r}")
    try:
        fleets.get("another-group", FLEET)
        raise Failure("the fleet answered under another resource group")
    except ResourceNotFoundError:
        pass
    patched = lro("fleets.begin_update (tags)", fleets.begin_update(
        RG, FLEET, m.FleetPatch(tags={"purpose": "sdk-test", "run": "1"})))
    check(patched.tags == {"purpose": "sdk-test", "run": "1"}, f"patched fleet tags {patched.tags!r}")
    check(fleets.get(RG, FLEET).tags == patched.tags, "fleet tags after the patch")
    check(FLEET in [f.name for f in fleets.list_by_resource_group(RG)], "fleet not in list_by_resource_group")
    check(FLEET in [f.name for f in fleets.list_by_subscription()], "fleet not in list_by_subscription")
    ok("get (also in upper case; 404 under another group), tags patched, both lists")

    step(f"create members {', '.join(MEMBERS)}")
    for name, group in MEMBERS.items():
        body = m.FleetMember(properties=m.FleetMemberProperties(
            cluster_resource_id=cluster_id(name), group=group, labels={"ring": group}))
        member = lro(f"fleet_members.begin_create {name}", members.begin_create(RG, FLEET, name, body))
        same_id(member.id, f"{FLEET_ID}/members/{name}", f"member {name}")
        check(member.name == name, f"member name {member.name!r}")
        check(member.properties.cluster_resource_id.lower() == cluster_id(name).lower(),
              f"member {name} clusterResourceId {member.properties.cluster_resource_id!r}")
        check(member.properties.group == group, f"member {name} group {member.properties.group!r}")
        check(member.properties.labels == {"ring": group}, f"member {name} labels {member.properties.labels!r}")
        check(member.system_data is not None and member.system_data.created_by == SUBJECT,
              f"member {name} systemData {member.system_data!r}")
    ok(f"{len(MEMBERS)} members, ids under {FLEET_ID}/members/")

    step("create update strategies: safe (approval gate, after-stage wait) and quick (no gates)")
    safe_body = m.FleetUpdateStrategy(properties=m.FleetUpdateStrategyProperties(strategy=m.UpdateRunStrategy(stages=[
        m.UpdateStage(name="canary", groups=[m.UpdateGroup(name="canary")],
                      before_gates=[m.GateConfiguration(type="Approval", display_name="Canary go")],
                      after_stage_wait_in_seconds=3600),
        m.UpdateStage(name="prod", groups=[m.UpdateGroup(name="prod")]),
    ])))
    safe = lro("fleet_update_strategies.begin_create_or_update safe",
               strategies.begin_create_or_update(RG, FLEET, "safe", safe_body))
    same_id(safe.id, f"{FLEET_ID}/updateStrategies/safe", "strategy safe")
    stages = safe.properties.strategy.stages
    check([s.name for s in stages] == ["canary", "prod"], f"strategy stages {[s.name for s in stages]}")
    check(stages[0].after_stage_wait_in_seconds == 3600, f"afterStageWaitInSeconds {stages[0].after_stage_wait_in_seconds}")
    check(len(stages[0].before_gates or []) == 1 and stages[0].before_gates[0].type == "Approval"
          and stages[0].before_gates[0].display_name == "Canary go", f"beforeGates {stages[0].before_gates}")
    quick_body = m.FleetUpdateStrategy(properties=m.FleetUpdateStrategyProperties(strategy=m.UpdateRunStrategy(stages=[
        m.UpdateStage(name="all", groups=[m.UpdateGroup(name="canary"), m.UpdateGroup(name="prod")]),
    ])))
    quick = lro("fleet_update_strategies.begin_create_or_update quick",
                strategies.begin_create_or_update(RG, FLEET, "quick", quick_body))
    same_id(quick.id, f"{FLEET_ID}/updateStrategies/quick", "strategy quick")
    ok(f"{safe.id}; {quick.id}")

    def run_body(strategy_id):
        return m.UpdateRun(properties=m.UpdateRunProperties(
            update_strategy_id=strategy_id,
            managed_cluster_update=m.ManagedClusterUpdate(
                upgrade=m.ManagedClusterUpgradeSpec(type="Full", kubernetes_version=VERSION),
                node_image_selection=m.NodeImageSelection(type="Latest"))))

    step(f"create update run rollout (Full to {VERSION}, strategy safe)")
    run = lro("update_runs.begin_create_or_update rollout",
              runs.begin_create_or_update(RG, FLEET, "rollout", run_body(safe.id)))
    run_id = f"{FLEET_ID}/updateRuns/rollout"
    same_id(run.id, run_id, "run rollout")
    same_id(run.properties.update_strategy_id, safe.id, "run updateStrategyId")
    check([s.name for s in run.properties.strategy.stages] == ["canary", "prod"], "run's copied strategy")
    check(run_state(run) == "NotStarted", f"new run state {run_state(run)!r}")
    check(run.system_data is not None and run.system_data.created_by == SUBJECT, f"run systemData {run.system_data!r}")
    check(run.properties.managed_cluster_update.upgrade.kubernetes_version == VERSION, "run kubernetesVersion")
    ok(f"{run.id} NotStarted")

    step("start rollout")
    run = lro("update_runs.begin_start", runs.begin_start(RG, FLEET, "rollout"))
    check(run_state(run) in ("Running", "Pending"), f"started run state {run_state(run)!r}")
    ok(f"state {run_state(run)}")

    step("list the pending gate and approve it")
    pending = wait_for("a Pending gate", lambda: list(gates.list_by_fleet(RG, FLEET, filter="state eq Pending")),
                       lambda g: len(g) > 0, 20)
    check(len(pending) == 1, f"{len(pending)} pending gates, expected 1")
    gate = pending[0]
    arm_id(gate.id, "gate id")
    same_id(gate.id, f"{FLEET_ID}/gates/{gate.name}", "gate")
    props = gate.properties
    check(props.state == "Pending", f"gate state {props.state!r}")
    check(props.gate_type == "Approval", f"gate type {props.gate_type!r}")
    check(props.display_name == "Canary go", f"gate displayName {props.display_name!r}")
    same_id(props.target.id, run_id, "gate target")
    target = props.target.update_run_properties
    check(target.name == "rollout" and target.stage == "canary" and target.timing == "Before" and not target.group,
          f"gate target properties {target!r}")
    check(gate.name in [g.name for g in gates.list_by_fleet(RG, FLEET)], "gate not in the unfiltered list")
    same_id(gates.get(RG, FLEET, gate.name).id, gate.id, "gates.get")
    run = runs.get(RG, FLEET, "rollout")
    before = stage_status(run, "canary").before_gates or []
    check(len(before) == 1, f"run status canary beforeGates {before}")
    same_id(before[0].gate_id, gate.id, "run status gateId")
    approved = lro("gates.begin_update", gates.begin_update(
        RG, FLEET, gate.name, m.GatePatch(properties=m.GatePatchProperties(state="Completed"))))
    check(approved.properties.state == "Completed", f"approved gate state {approved.properties.state!r}")
    check(approved.system_data is not None and approved.system_data.last_modified_by == SUBJECT,
          f"approved gate systemData {approved.system_data!r}, expected lastModifiedBy {SUBJECT}")
    check(list(gates.list_by_fleet(RG, FLEET, filter="state eq Pending")) == [], "a gate still Pending after approval")
    ok(f"{gate.id} Completed")

    step("skip member m5 and the after-stage wait of canary")
    run = lro("update_runs.begin_skip", runs.begin_skip(RG, FLEET, "rollout", m.SkipProperties(targets=[
        m.SkipTarget(type="Member", name="m5"), m.SkipTarget(type="AfterStageWait", name="canary")])))
    check(member_states(run).get("m5") == "Skipped", f"m5 after skip: {member_states(run).get('m5')!r}")
    check(run_state(run) in ("Running", "Pending"), f"run state after skip {run_state(run)!r}")
    ok(f"m5 Skipped, run {run_state(run)}")

    step("stop rollout")
    run = lro("update_runs.begin_stop", runs.begin_stop(RG, FLEET, "rollout"))
    check(run_state(run) in ("Stopping", "Stopped"), f"run state after stop {run_state(run)!r}")
    run = wait_for("run Stopped", lambda: runs.get(RG, FLEET, "rollout"), lambda r: run_state(r) == "Stopped", 30)
    check(any(s != "Completed" for n, s in member_states(run).items() if n != "m5"),
          f"every member finished before the stop: {member_states(run)}")
    ok(f"Stopped with members {member_states(run)}")

    step("start rollout again and wait to the end")
    run = lro("update_runs.begin_start (again)", runs.begin_start(RG, FLEET, "rollout"))
    check(run_state(run) in ("Running", "Pending"), f"restarted run state {run_state(run)!r}")
    run = wait_for("run terminal", lambda: runs.get(RG, FLEET, "rollout"),
                   lambda r: run_state(r) in ("Completed", "Failed", "Skipped", "Stopped"), 90, 0.5)
    check(run_state(run) == "Completed", f"run ended {run_state(run)!r}: {run.properties.status.status.error}")
    states = member_states(run)
    check(states == {"m1": "Completed", "m2": "Completed", "m3": "Completed", "m4": "Completed", "m5": "Skipped"},
          f"member states {states}")
    canary, prod = stage_status(run, "canary"), stage_status(run, "prod")
    check(canary.status.state == "Completed" and prod.status.state == "Completed",
          f"stages {canary.status.state}, {prod.status.state}")
    check(canary.after_stage_wait_status is not None
          and canary.after_stage_wait_status.status.state == "Skipped",
          f"canary afterStageWaitStatus {canary.after_stage_wait_status!r}")
    check(canary.before_gates[0].status.state == "Completed", f"canary gate status {canary.before_gates[0].status!r}")
    m1 = members.get(RG, FLEET, "m1")
    ops = {mem.name: mem.operation_id for st in run.properties.status.stages for g in st.groups for mem in g.members}
    check(m1.properties.status is not None and m1.properties.status.last_operation_id
          and m1.properties.status.last_operation_id == ops.get("m1"),
          f"member m1 status.lastOperationId {getattr(m1.properties.status, 'last_operation_id', None)!r}, "
          f"run says {ops.get('m1')!r}")
    ok(f"Completed; members {states}; wait Skipped")

    step("page through members and runs with top=2")
    for name in ("extra-1", "extra-2"):
        lro(f"update_runs.begin_create_or_update {name}", runs.begin_create_or_update(RG, FLEET, name, run_body(safe.id)))
    got, links = pages("members", members.list_by_fleet(RG, FLEET, top=2), base)
    flat = [n for p in got for n in p]
    check(sorted(flat) == sorted(MEMBERS), f"members listed {flat}")
    check(all(len(p) <= 2 for p in got) and len(got) >= 3 and len(links) >= 2,
          f"member pages {got} (nextLinks followed: {len(links)})")
    ok(f"members in pages {got}")
    got, links = pages("runs", runs.list_by_fleet(RG, FLEET, top=2), base)
    flat = [n for p in got for n in p]
    check(sorted(flat) == ["extra-1", "extra-2", "rollout"], f"runs listed {flat}")
    check(all(len(p) <= 2 for p in got) and len(got) >= 2 and len(links) >= 1,
          f"run pages {got} (nextLinks followed: {len(links)})")
    for r in runs.list_by_fleet(RG, FLEET, top=2):
        arm_id(r.id, f"listed run {r.name}")
        arm_id(r.properties.update_strategy_id, f"listed run {r.name} updateStrategyId")
    ok(f"runs in pages {got}")
    got, _ = pages("strategies", strategies.list_by_fleet(RG, FLEET, top=1), base)
    check(sorted(n for p in got for n in p) == ["quick", "safe"] and len(got) >= 2, f"strategy pages {got}")
    ok(f"strategies in pages {got}")

    step("create auto-upgrade profile rapid (channel Rapid, strategy quick) and generate its run")
    profile = lro("auto_upgrade_profiles.begin_create_or_update", profiles.begin_create_or_update(
        RG, FLEET, "rapid", m.AutoUpgradeProfile(properties=m.AutoUpgradeProfileProperties(
            channel="Rapid", update_strategy_id=quick.id))))
    same_id(profile.id, f"{FLEET_ID}/autoUpgradeProfiles/rapid", "profile")
    check(profile.properties.channel == "Rapid", f"profile channel {profile.properties.channel!r}")
    same_id(profile.properties.update_strategy_id, quick.id, "profile updateStrategyId")
    generated = lro("auto_upgrade_profile_operations.begin_generate_update_run",
                    client.auto_upgrade_profile_operations.begin_generate_update_run(RG, FLEET, "rapid"))
    arm_id(generated.id, "generated run id")
    check(generated.id.lower().startswith(f"{FLEET_ID}/updateRuns/".lower()), f"generated run id {generated.id!r}")
    gen_name = generated.id.rsplit("/", 1)[1]
    again = lro("begin_generate_update_run (again)",
                client.auto_upgrade_profile_operations.begin_generate_update_run(RG, FLEET, "rapid"))
    same_id(again.id, generated.id, "generating again")
    gen = runs.get(RG, FLEET, gen_name)
    same_id(gen.properties.auto_upgrade_profile_id, profile.id, "generated run autoUpgradeProfileId")
    same_id(gen.properties.update_strategy_id, quick.id, "generated run updateStrategyId")
    check(gen.properties.managed_cluster_update.upgrade.type == "Full"
          and gen.properties.managed_cluster_update.upgrade.kubernetes_version == VERSION,
          f"generated run upgrade {gen.properties.managed_cluster_update.upgrade!r}")
    # The profile may also have started it on its own (the target is out): let that finish.
    gen = wait_for("generated run settled", lambda: runs.get(RG, FLEET, gen_name),
                   lambda r: run_state(r) in ("NotStarted", "Completed", "Skipped", "Failed", "Stopped"), 60, 0.5)
    ok(f"{generated.id} ({run_state(gen)})")

    step("delete everything")
    for name in ("rollout", "extra-1", "extra-2", gen_name):
        lro(f"update_runs.begin_delete {name}", runs.begin_delete(RG, FLEET, name))
    check(list(runs.list_by_fleet(RG, FLEET)) == [], "runs left after deleting them")
    lro("auto_upgrade_profiles.begin_delete", profiles.begin_delete(RG, FLEET, "rapid"))
    for name in ("safe", "quick"):
        lro(f"fleet_update_strategies.begin_delete {name}", strategies.begin_delete(RG, FLEET, name))
    for name in MEMBERS:
        lro(f"fleet_members.begin_delete {name}", members.begin_delete(RG, FLEET, name))
    lro("fleet_members.begin_delete m5 (already gone)", members.begin_delete(RG, FLEET, "m5"))
    try:
        members.get(RG, FLEET, "m5")
        raise Failure("member m5 still there after delete")
    except ResourceNotFoundError:
        pass
    lro("fleets.begin_delete", fleets.begin_delete(RG, FLEET))
    lro("fleets.begin_delete (already gone)", fleets.begin_delete(RG, FLEET))
    try:
        fleets.get(RG, FLEET)
        raise Failure("fleet still there after delete")
    except ResourceNotFoundError:
        pass
    check(FLEET not in [f.name for f in fleets.list_by_resource_group(RG)], "fleet still listed after delete")
    ok("runs, profile, strategies, members, fleet; m5 and the fleet deleted twice")
    print("PASS: the Azure SDK for Python drove every step", flush=True)


if __name__ == "__main__":
    try:
        main()
    except HttpResponseError as e:
        r = e.response
        req = r.request if r is not None else None
        print(f"FAIL: HTTP {e.status_code} on {req.method if req else '?'} "
              f"{urllib.parse.unquote(req.url) if req else '?'}", flush=True)
        print(f"      {e.message.splitlines()[0] if e.message else ''}", flush=True)
        if r is not None:
            try:
                print(f"      body: {r.text()[:2000]}", flush=True)
            except Exception:  # noqa: BLE001 - the body may already be consumed
                pass
        sys.exit(1)
    except Failure as e:
        print(f"FAIL: {e}", flush=True)
        sys.exit(1)
