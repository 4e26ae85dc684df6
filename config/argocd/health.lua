-- Argo CD health check for OutboxRelay (outboxrelay.io/v1beta1 and v1alpha1), from the conditions the
-- operator writes after kstatus' conventions: Stalled=True is Degraded (a person must fix
-- something; the message says what), Suspended=True (spec.suspend: no pods, delivery stopped
-- on purpose) is Suspended, Reconciling=True or a generation the operator has not seen yet is
-- Progressing, Ready=True is Healthy. Install it with the snippet in the README
-- (resource.customizations.health.outboxrelay.io_OutboxRelay in argocd-cm).
local hs = { status = "Progressing", message = "waiting for the operator's first status" }
if obj.status == nil then
  return hs
end

local generation = obj.metadata.generation
if generation ~= nil and obj.status.observedGeneration ~= generation then
  hs.message = "waiting for the operator to see generation " .. generation
  return hs
end

local function condition(kind)
  for _, c in ipairs(obj.status.conditions or {}) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function describe(c)
  return (c.reason or "") .. ": " .. (c.message or "")
end

local stalled = condition("Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(stalled)
  return hs
end

local suspended = condition("Suspended")
if suspended ~= nil and suspended.status == "True" then
  hs.status = "Suspended"
  hs.message = describe(suspended)
  return hs
end

local reconciling = condition("Reconciling")
if reconciling ~= nil and reconciling.status == "True" then
  hs.message = describe(reconciling)
  return hs
end

local ready = condition("Ready")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = describe(ready)
  return hs
end
if ready ~= nil then
  hs.message = describe(ready)
end
return hs
