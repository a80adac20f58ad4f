-- JSON-RPC 2.0 client over `abx rpc` (a bridge to the per-user broker daemon).
--
-- The child speaks newline-delimited JSON (the broker detects the framing from the first
-- byte). Requests run concurrently; replies are matched by id. Notifications go to
-- listeners registered with `on(method, fn)`; `exec/output` and `exec/exit` go to the
-- handlers of their `execId` (`subscribe_exec`), and are held until that handler is set,
-- since the reply to `exec/start` may be read in the same chunk as the first output.
-- `cancel(id)` sends `$/cancelRequest`.
--
-- When the bridge exits on its own (not through `stop`), the requests waiting for it fail
-- with E1007, and the execs that were streaming to it are re-attached: a new bridge is
-- started and `exec/attach` sent for each, so their output continues (the broker keeps a
-- detached exec's output and replays it on attach). An exec that cannot be re-attached
-- gets `on_lost`.
--
-- Requests made with `persist` (subscriptions such as `sandbox/subscribe`) belong to the
-- connection, not to one request: they are sent on every new bridge, first, and a bridge
-- that exits on its own after it had answered is started again at once when there are any,
-- so their notifications keep coming.
--
-- Messages are handled from a queue drained in a vim.schedule() callback, never inside
-- the job's stdout callback: a handler may then wait for another reply (vim.wait), and
-- the lines that arrive meanwhile are handled in order by a nested drain.
local util = require("abx.util")

local M = {}

local Client = {}
Client.__index = Client

-- Notifications for exec ids nobody subscribed to yet are kept up to this many per exec.
local HELD_MAX = 4096
local STDERR_KEEP = 20

--- opts: cmd (argv list), env (table or nil), request_timeout (ms), client_info
--- ({name, version}: sent with `initialize` on every new bridge)
function M.new(opts)
  local self = setmetatable({}, Client)
  self.cmd = opts.cmd
  self.env = opts.env
  self.request_timeout = opts.request_timeout or 30000
  self.client_info = opts.client_info
  self.next_id = 0
  self.pending = {} -- id -> {method, cb, job}
  self.listeners = {} -- method -> {fn, ...}
  self.execs = {} -- execId -> {handlers, job}
  self.held = {} -- execId -> {job, items = {{method, params}, ...}}
  self.job = nil
  self.partial = {} -- job -> {pieces}
  self.queue, self.qhead, self.qtail = {}, 1, 0
  self.scheduled = false
  self.stderr = {}
  self.persistent = {} -- key -> {method, params, cb, after_undo}
  self.undoing = {} -- key -> true while forget's undo request waits for its reply
  self.answered = {} -- job -> true once it sent a message
  return self
end

function Client:is_running()
  return self.job ~= nil
end

local function lost(entry, err, exec_id)
  if entry.handlers.on_lost then
    pcall(entry.handlers.on_lost, err, exec_id)
  end
end

-- Everything that belonged to `job` (nil: every job) fails with `err`; with `reattach`, the
-- execs of the job are re-attached over a new bridge instead.
function Client:_fail_job(job, err, reattach)
  for id, p in pairs(self.pending) do
    if job == nil or p.job == job then
      self.pending[id] = nil
      if p.cb then
        pcall(p.cb, err, nil)
      end
    end
  end
  for id, h in pairs(self.held) do
    if job == nil or h.job == job then
      self.held[id] = nil
    end
  end
  local again = {}
  for id, e in pairs(self.execs) do
    if job == nil or e.job == job then
      self.execs[id] = nil
      if reattach then
        again[#again + 1] = { id = id, entry = e }
      else
        lost(e, err, id)
      end
    end
  end
  if #again > 0 then
    self:_reattach(again, err)
  end
end

-- Start a new bridge and `exec/attach` each of `list` ({id, entry}) to it; the output the
-- broker kept meanwhile is replayed, then the stream continues.
function Client:_reattach(list, err)
  local ok, serr = self:start()
  for _, item in ipairs(list) do
    local id, entry = item.id, item.entry
    if not ok then
      lost(entry, serr or err, id)
    else
      entry.job = self.job
      self.execs[id] = entry
      if entry.handlers.on_detached then
        pcall(entry.handlers.on_detached, id)
      end
      self:request("exec/attach", { execId = id }, function(aerr, res)
        if aerr then
          if self.execs[id] == entry then
            self.execs[id] = nil
            lost(entry, aerr, id)
          end
          return
        end
        if entry.handlers.on_reattach then
          pcall(entry.handlers.on_reattach, res, id)
        end
        -- what was kept (its exit too) is replayed before this reply: an exec that has ended
        -- and is still here lost its exit on the way
        if type(res) == "table" and util.v(res.running) == false and self.execs[id] == entry then
          self.execs[id] = nil
          lost(
            entry,
            util.make_error("E3002", "The command ended while the bridge restarted; its exit status was lost.", "Run it again to see its status."),
            id
          )
        end
      end)
    end
  end
end

function Client:_unreachable(detail)
  return util.make_error(
    "E1007",
    "The abx broker is not reachable: " .. detail,
    "Check the 'abx' path (require('abx').setup{abx = ...}), run ':checkhealth abx' or 'abx broker start'."
  )
end

--- Start `abx rpc` unless running. Returns true, or false and an error object.
function Client:start()
  if self.job then
    return true
  end
  self.stderr = {}
  local job
  local opts = {
    on_stdout = function(j, data)
      self:_on_stdout(j, data)
    end,
    on_stderr = function(_, data)
      for _, l in ipairs(data) do
        if l ~= "" then
          table.insert(self.stderr, l)
          if #self.stderr > STDERR_KEEP then
            table.remove(self.stderr, 1)
          end
        end
      end
    end,
    on_exit = function(j, code)
      local detail = "'abx rpc' exited with code " .. tostring(code)
      if #self.stderr > 0 then
        detail = detail .. ": " .. table.concat(self.stderr, " ")
      end
      -- not stopped by us (stop() clears self.job first): its execs are re-attached
      local unexpected = self.job == j
      if self.job == j then
        self.job = nil
      end
      if unexpected then
        -- at once, not in the scheduled re-attach: what is typed meanwhile must wait for it
        for id, e in pairs(self.execs) do
          if e.job == j and e.handlers.on_detached then
            pcall(e.handlers.on_detached, id)
          end
        end
      end
      local err = self:_unreachable(detail)
      local worked = self.answered[j]
      self.answered[j] = nil
      vim.schedule(function()
        -- replies that arrived before the exit are delivered first
        self:_drain()
        self.partial[j] = nil
        self:_fail_job(j, err, unexpected)
        -- subscriptions live on in a new bridge; one that never answered is not restarted
        -- (that would be a loop), the next request tries again
        if unexpected and worked and next(self.persistent) and not self.job then
          local ok, serr = self:start()
          if not ok then
            for _, p in pairs(self.persistent) do
              if p.cb then
                pcall(p.cb, serr, nil)
              end
            end
          end
        end
      end)
    end,
  }
  if self.env and next(self.env) then
    opts.env = self.env
  end
  local ok
  ok, job = pcall(vim.fn.jobstart, self.cmd, opts)
  if not ok or type(job) ~= "number" or job <= 0 then
    local why = ok and ("jobstart returned " .. tostring(job)) or tostring(job)
    return false, self:_unreachable("cannot run '" .. table.concat(self.cmd, " ") .. "' (" .. why .. ")")
  end
  self.job = job
  self.partial[job] = {}
  -- who asks, first: the broker names this client in the log of the commands it runs
  -- (`sandbox/log`); an error here changes nothing else
  if self.client_info then
    self:request("initialize", { clientInfo = self.client_info }, function() end)
  end
  -- before whatever request started this bridge: a subscription precedes the list it guards
  for _, p in pairs(self.persistent) do
    if not p.after_undo then
      self:request(p.method, p.params, p.cb)
    end
  end
  return true
end

--- Send `method` now and on every new bridge (a subscription of this connection, e.g.
--- `sandbox/subscribe`); `cb(err, result)` after each. `key` names it for `forget`.
function Client:persist(key, method, params, cb)
  local p = { method = method, params = params, cb = cb }
  self.persistent[key] = p
  if self.undoing[key] then
    -- the broker serves requests concurrently: an unsubscribe still on its way could land
    -- after this subscribe and undo it; it is sent once the undo has answered
    p.after_undo = true
  elseif self.job then
    self:request(method, params, cb)
  else
    local ok, err = self:start() -- sends it
    if not ok and cb then
      cb(err, nil)
    end
  end
end

--- Stop re-sending what `persist(key, ...)` sent; `undo` ({method, params}) is sent once now
--- when the bridge runs.
function Client:forget(key, undo)
  if not self.persistent[key] then
    return
  end
  self.persistent[key] = nil
  if undo and self.job and not self.undoing[key] then
    self.undoing[key] = true
    self:request(undo[1], undo[2], function()
      self.undoing[key] = nil
      local p = self.persistent[key]
      if p and p.after_undo then
        p.after_undo = nil
        self:request(p.method, p.params, p.cb)
      end
    end)
  end
end

--- Close the bridge: stdin is closed (the bridge then exits) and the job stopped.
--- With `silent`, waiting callbacks are dropped instead of getting an error.
function Client:stop(silent)
  local job = self.job
  if not job then
    return
  end
  self.job = nil
  pcall(vim.fn.chanclose, job, "stdin")
  pcall(vim.fn.jobstop, job)
  self.persistent, self.undoing = {}, {}
  if silent then
    self.pending, self.execs, self.held = {}, {}, {}
  else
    self:_fail_job(job, util.make_error("E1006", "The abx client was stopped.", "Run the command again.", -32800))
  end
end

function Client:_on_stdout(job, data)
  -- jobstart: data[1] continues the previous partial line, data[#data] starts a new one
  local n = #data
  local partial = self.partial[job]
  if n == 0 or not partial then
    return
  end
  if n == 1 then
    if data[1] ~= "" then
      table.insert(partial, data[1])
    end
    return
  end
  table.insert(partial, data[1])
  self:_enqueue(job, table.concat(partial))
  partial = {}
  for i = 2, n - 1 do
    self:_enqueue(job, data[i])
  end
  if data[n] ~= "" then
    partial[1] = data[n]
  end
  self.partial[job] = partial
  if not self.scheduled then
    self.scheduled = true
    vim.schedule(function()
      self.scheduled = false
      self:_drain()
    end)
  end
end

function Client:_enqueue(job, line)
  self.qtail = self.qtail + 1
  self.queue[self.qtail] = { job, line }
end

-- Lines are handled strictly in arrival order, also when a handler waits for a reply
-- (a drain scheduled meanwhile takes the next line from the same queue).
function Client:_drain()
  while self.qhead <= self.qtail do
    local item = self.queue[self.qhead]
    self.queue[self.qhead] = nil
    self.qhead = self.qhead + 1
    self:_on_line(item[1], item[2])
  end
end

function Client:_on_line(job, line)
  if line == "" or line == "\r" then
    return
  end
  self.answered[job] = true
  local ok, msg = pcall(vim.json.decode, line)
  if not ok or type(msg) ~= "table" then
    return
  end
  if msg[1] ~= nil then -- a batch reply
    for _, m in ipairs(msg) do
      self:_on_message(job, m)
    end
  else
    self:_on_message(job, msg)
  end
end

function Client:_on_message(job, msg)
  local method = util.v(msg.method)
  local id = util.v(msg.id)
  if method and id == nil then
    self:_on_notification(job, method, util.v(msg.params) or {})
  elseif method then
    -- a request from the broker: nothing is served here
    if self.job == job then
      self:_send({ jsonrpc = "2.0", id = id, error = { code = -32601, message = "Method not found" } })
    end
  elseif id ~= nil then
    local p = self.pending[id]
    if p then
      self.pending[id] = nil
      local err = util.v(msg.error)
      if p.cb then
        -- a failing callback must not lose the messages after it
        local cb_ok, e
        if err then
          cb_ok, e = pcall(p.cb, err, nil)
        else
          cb_ok, e = pcall(p.cb, nil, util.v(msg.result))
        end
        if not cb_ok then
          util.notify("abx: handler of " .. tostring(p.method) .. " failed: " .. tostring(e), vim.log.levels.ERROR)
        end
      end
    end
  end
end

function Client:_on_notification(job, method, params)
  if method == "exec/output" or method == "exec/exit" then
    local exec_id = params.execId
    local e = exec_id and self.execs[exec_id]
    if e then
      self:_deliver_exec(e.handlers, method, params)
    elseif exec_id then
      local h = self.held[exec_id]
      if not h then
        h = { job = job, items = {} }
        self.held[exec_id] = h
      end
      if #h.items < HELD_MAX then
        table.insert(h.items, { method, params })
      end
    end
  end
  local ls = self.listeners[method]
  if ls then
    for _, fn in ipairs({ unpack(ls) }) do
      local ok, err = pcall(fn, params)
      if not ok then
        util.notify("abx: listener for " .. method .. " failed: " .. tostring(err), vim.log.levels.WARN)
      end
    end
  end
end

function Client:_deliver_exec(h, method, params)
  if method == "exec/output" then
    if h.on_output then
      local ok, e = pcall(h.on_output, params)
      if not ok then
        util.notify("abx: exec output handler failed: " .. tostring(e), vim.log.levels.WARN)
      end
    end
  else
    self.execs[params.execId] = nil
    if h.on_exit then
      local ok, e = pcall(h.on_exit, params)
      if not ok then
        util.notify("abx: exec exit handler failed: " .. tostring(e), vim.log.levels.WARN)
      end
    end
  end
end

--- Route `exec/output` / `exec/exit` of `exec_id` to `handlers` {on_output, on_exit,
--- on_lost, on_detached, on_reattach}; anything that arrived before is delivered now.
--- After a bridge restart the exec is re-attached: on_detached() when the bridge is seen
--- gone and when `exec/attach` is sent, on_reattach(result) once it answered (only then may this connection write to,
--- resize or kill the exec), on_lost(err) when it cannot be re-attached.
function Client:subscribe_exec(exec_id, handlers)
  local entry = { handlers = handlers, job = self.job }
  self.execs[exec_id] = entry
  local h = self.held[exec_id]
  self.held[exec_id] = nil
  if h then
    for _, item in ipairs(h.items) do
      if self.execs[exec_id] ~= entry then
        break
      end
      self:_deliver_exec(handlers, item[1], item[2])
    end
  end
end

function Client:unsubscribe_exec(exec_id)
  self.execs[exec_id] = nil
  self.held[exec_id] = nil
end

--- Listen to a notification method; returns a function that removes the listener.
function Client:on(method, fn)
  local ls = self.listeners[method] or {}
  self.listeners[method] = ls
  table.insert(ls, fn)
  return function()
    for i, f in ipairs(ls) do
      if f == fn then
        table.remove(ls, i)
        return
      end
    end
  end
end

function Client:_send(msg)
  local ok, line = pcall(vim.json.encode, msg)
  if not ok then
    return false, util.make_error("E1004", "Cannot encode the request: " .. tostring(line), "This is a bug in abx.nvim.")
  end
  local sent, n = pcall(vim.fn.chansend, self.job, line .. "\n")
  if not sent or n == 0 then
    return false, self:_unreachable("cannot write to 'abx rpc'")
  end
  return true
end

local function params_value(params)
  if params == nil or (type(params) == "table" and next(params) == nil) then
    return vim.empty_dict()
  end
  return params
end

--- Send a request; `cb(err, result)` runs on the main loop. Returns the request id, or nil
--- when it could not be sent (cb has then been called with the error).
function Client:request(method, params, cb)
  local ok, err = self:start()
  if not ok then
    if cb then
      cb(err, nil)
    end
    return nil
  end
  self.next_id = self.next_id + 1
  local id = self.next_id
  self.pending[id] = { method = method, cb = cb, job = self.job }
  local sent, serr = self:_send({ jsonrpc = "2.0", id = id, method = method, params = params_value(params) })
  if not sent then
    self.pending[id] = nil
    if cb then
      cb(serr, nil)
    end
    return nil
  end
  return id
end

--- Send a notification (no reply).
function Client:notify(method, params)
  local ok, err = self:start()
  if not ok then
    return false, err
  end
  return self:_send({ jsonrpc = "2.0", method = method, params = params_value(params) })
end

--- Cancel a request with `$/cancelRequest`; its callback gets the broker's -32800 reply
--- (or, with `local_error`, that error at once and the late reply is dropped).
function Client:cancel(id, local_error)
  if id == nil then
    return
  end
  local p = self.pending[id]
  if self.job and p and p.job == self.job then
    self:notify("$/cancelRequest", { id = id })
  end
  if p and local_error then
    self.pending[id] = nil
    if p.cb then
      p.cb(local_error, nil)
    end
  end
end

--- The requests waiting for a reply: {{id, method}, ...} by id.
function Client:in_flight()
  local out = {}
  for id, p in pairs(self.pending) do
    out[#out + 1] = { id = id, method = p.method }
  end
  table.sort(out, function(a, b)
    return a.id < b.id
  end)
  return out
end

--- Send a request and wait for its reply (processing events meanwhile). On timeout or
--- Ctrl-C the request is cancelled. Returns result, err.
function Client:request_sync(method, params, timeout_ms)
  timeout_ms = timeout_ms or self.request_timeout
  local done, res, rerr = false, nil, nil
  local id = self:request(method, params, function(e, r)
    done, rerr, res = true, e, r
  end)
  if id == nil then
    return nil, rerr
  end
  local ok, why = vim.wait(timeout_ms, function()
    return done
  end, 10)
  if not ok and not done then
    local msg
    if why == -2 then
      msg = "Request '" .. method .. "' interrupted; it was cancelled."
    else
      msg = string.format("Request '%s' got no reply within %d ms; it was cancelled.", method, timeout_ms)
    end
    local e = util.make_error(
      "E1006",
      msg,
      "Raise require('abx').setup{request_timeout = ...} (ms) for slow providers.",
      -32800
    )
    self:cancel(id, e)
    return nil, e
  end
  return res, rerr
end

return M
