"""The broker and its Lua scripts (asyncq/_broker, asyncq/_broker/lua): Redis state before
and after each script."""
