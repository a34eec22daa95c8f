-- probe: the connect-time permission check. It runs nothing: calling it makes the server check that this user may
-- run and load scripts and may access a key under the client's prefix (ACL checks a script's declared keys before
-- it runs). It changes nothing, whatever the probe key holds.
--
-- KEYS[1]  a lock key under the client's prefix
--
-- Returns  1
return 1
