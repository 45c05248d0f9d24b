-- Argo CD health check for webhook-operator.io WebhookEndpoint, RetryPolicy and WebhookReplay.
-- Install it under resource.customizations.health.webhook-operator.io_<Kind> for each of the
-- three kinds in argocd-cm (see README).
-- It reads the conditions the way kstatus (Flux) does: Stalled is Degraded (a refused spec, a
-- replay refused while its endpoint is disabled or completed with failures), Ready True is
-- Healthy (an endpoint wired, a replay complete), otherwise Progressing (with the progress of
-- a replay in the message). An auto-disabled endpoint is Degraded: it needs a person
-- (`kubectl webhooks enable`).
hs = {}
if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "waiting for the controller"
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration ~= obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "waiting for the controller to observe generation " .. obj.metadata.generation
  return hs
end
local ready = nil
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Stalled" and c.status == "True" then
    hs.status = "Degraded"
    hs.message = c.message
    return hs
  end
  if c.type == "Disabled" and c.status == "True" then
    hs.status = "Degraded"
    hs.message = "auto-disabled: " .. (c.message or c.reason)
    return hs
  end
  if c.type == "Ready" then
    ready = c
  end
end
if ready == nil then
  hs.status = "Progressing"
  hs.message = "waiting for the controller"
  return hs
end
hs.message = ready.message
if ready.status == "True" then
  hs.status = "Healthy"
elseif ready.reason == "Suspended" then
  hs.status = "Suspended"
else
  hs.status = "Progressing"
end
return hs
