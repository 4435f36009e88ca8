"""Scheduling (asyncq/_scheduling: the Scheduler, cron specs, the periodic task manager;
App.cron)."""
