"""What asyncq gives applications for their tests (asyncq/testing: the pytest plugin;
asyncq/devserver)."""
