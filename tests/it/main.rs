
mod sim_talos;
